//! What the kube source lists and watches for each kind: the API path, the selectors, and
//! whether the cluster may lack the resource.

use kpng_model::Kind;

use crate::convert::ConvertOptions;
use crate::kube::NodeSelection;

/// One kind as the API serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// The model kind.
    pub kind: Kind,
    /// The collection's path (`/api/v1/services`).
    pub path: &'static str,
    /// The label selector, if any.
    pub label_selector: Option<String>,
    /// The field selector, if any.
    pub field_selector: Option<String>,
    /// Whether the cluster may not serve it (404) or the proxy may not be allowed to read
    /// it (403): then it is treated as having no objects rather than blocking readiness.
    pub optional: bool,
    /// The paths of older versions to try, in order, when the server does not serve
    /// `path` (404): ServiceCIDRs were networking.k8s.io/v1beta1 before v1.
    pub older: &'static [&'static str],
}

impl Resource {
    /// The resource for `kind`, with the selectors that make the server send only what
    /// this proxy handles.
    pub fn new(kind: Kind, options: &ConvertOptions, nodes: &NodeSelection) -> Resource {
        let (path, label_selector, field_selector, optional) = match kind {
            Kind::Service => ("/api/v1/services", Some(options.label_selector()), None, false),
            Kind::EndpointSlice => (
                "/apis/discovery.k8s.io/v1/endpointslices",
                Some(options.label_selector()),
                None,
                false,
            ),
            Kind::Node => {
                let field = match nodes {
                    NodeSelection::One(name) => Some(format!("metadata.name={name}")),
                    NodeSelection::All => None,
                };
                ("/api/v1/nodes", None, field, false)
            }
            Kind::ServiceCidr => ("/apis/networking.k8s.io/v1/servicecidrs", None, None, true),
        };
        let older: &[&str] = match kind {
            Kind::ServiceCidr => &["/apis/networking.k8s.io/v1beta1/servicecidrs"],
            _ => &[],
        };
        Resource { kind, path, label_selector, field_selector, optional, older }
    }

    /// Moves to the next older version, if there is one (after a 404 on `path`).
    pub fn try_older(&mut self) -> Option<&'static str> {
        let (next, rest) = self.older.split_first()?;
        self.path = next;
        self.older = rest;
        Some(next)
    }

    /// The URL (path and query) of a list page.
    pub fn list_url(&self, limit: usize, continue_token: Option<&str>) -> String {
        let mut query = vec![("limit", limit.to_string())];
        query.extend(continue_token.map(|c| ("continue", c.to_string())));
        self.url(query)
    }

    /// The URL of a watch from `resource_version`, closed by the server after
    /// `timeout_seconds`.
    pub fn watch_url(&self, resource_version: &str, timeout_seconds: u32) -> String {
        self.url(vec![
            ("watch", "true".to_string()),
            ("allowWatchBookmarks", "true".to_string()),
            ("resourceVersion", resource_version.to_string()),
            ("timeoutSeconds", timeout_seconds.to_string()),
        ])
    }

    fn url(&self, mut query: Vec<(&str, String)>) -> String {
        query.extend(self.label_selector.clone().map(|s| ("labelSelector", s)));
        query.extend(self.field_selector.clone().map(|s| ("fieldSelector", s)));
        let pairs: Vec<String> =
            query.iter().map(|(k, v)| format!("{k}={}", percent_encode(v))).collect();
        format!("{}?{}", self.path, pairs.join("&"))
    }
}

/// `text` with every byte but unreserved ones (RFC 3986) percent-encoded.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b))
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_carry_the_selectors_encoded() {
        let options = ConvertOptions { service_proxy_name: Some("edge".into()) };
        let nodes = NodeSelection::One("n1".into());
        let services = Resource::new(Kind::Service, &options, &nodes);
        assert_eq!(
            services.list_url(500, Some("abc=")),
            "/api/v1/services?limit=500&continue=abc%3D&labelSelector=%21service.kubernetes.io%2Fheadless%2Cservice.kubernetes.io%2Fservice-proxy-name%3Dedge"
        );
        let node = Resource::new(Kind::Node, &options, &nodes);
        assert_eq!(
            node.watch_url("42", 290),
            "/api/v1/nodes?watch=true&allowWatchBookmarks=true&resourceVersion=42&timeoutSeconds=290&fieldSelector=metadata.name%3Dn1"
        );
        assert!(Resource::new(Kind::ServiceCidr, &options, &nodes).optional);
    }
}
