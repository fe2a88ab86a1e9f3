//! The kube-nftlb annotations of a Service (`service.kubernetes.io/kube-nftlb-load-balancer-<key>`)
//! → [`LoadBalancing`].
//!
//! A key or value kpng does not know is a warning naming the annotation and the values
//! allowed, and counted ([`rejected_annotations`]); the service is proxied as without that
//! annotation. The persistence timeout is `spec.sessionAffinityConfig.clientIP.timeoutSeconds`
//! when set, else [`DEFAULT_PERSISTENCE_TIMEOUT_SECONDS`].

use std::sync::atomic::{AtomicU64, Ordering};

use kpng_model::global::{
    AnnotationKey, DEFAULT_PERSISTENCE_TIMEOUT_SECONDS, Helper, LOAD_BALANCER_ANNOTATION_PREFIX,
    LoadBalancing, LogPath, NatMode, Persistence, PersistenceKey, Scheduler,
};

use super::{FieldError, printable};
use crate::schema::meta::Annotations;
use crate::schema::service::ServiceSpec;

/// Annotations rejected so far by this process's conversions.
static REJECTED: AtomicU64 = AtomicU64::new(0);

/// How many load-balancing annotations (a key or a value kpng does not know) conversions
/// have rejected in this process; each read of a Service carrying one counts (the
/// `kpng_rejected_annotations_total` metric).
pub fn rejected_annotations() -> u64 {
    REJECTED.load(Ordering::Relaxed)
}

/// The settings a Service's annotations give; rejected annotations go to `warnings`.
pub(super) fn load_balancing(
    annotations: &Annotations,
    spec: &ServiceSpec,
    warnings: &mut Vec<FieldError>,
) -> LoadBalancing {
    let mut lb = LoadBalancing::default();
    for (key, value) in &annotations.0 {
        let Some(setting) = key.strip_prefix(LOAD_BALANCER_ANNOTATION_PREFIX) else { continue };
        let field = format!("metadata.annotations[{:?}]", printable(key));
        let reject = |reason: String| {
            REJECTED.fetch_add(1, Ordering::Relaxed);
            let reason = format!("{reason}: ignored, the service is balanced as without it");
            FieldError::new(field.clone(), reason)
        };
        let Some(setting) = AnnotationKey::parse(setting) else {
            let unknown = format!("unknown setting {:?}", printable(setting));
            warnings.push(reject(format!("{unknown} (expected {})", AnnotationKey::expected())));
            continue;
        };
        if let Err(expected) = apply(&mut lb, setting, value.trim(), spec) {
            let unknown = format!("unknown {setting} {:?}", printable(value));
            warnings.push(reject(format!("{unknown} (expected {expected})")));
        }
    }
    lb
}

/// Sets `setting` from `value`; the accepted values otherwise.
fn apply(
    lb: &mut LoadBalancing,
    setting: AnnotationKey,
    value: &str,
    spec: &ServiceSpec,
) -> Result<(), String> {
    // "none" is kube-nftlb's spelling of the default where there is one.
    let with_none = |expected: String| format!("\"none\", {expected}");
    match setting {
        AnnotationKey::Scheduler => {
            lb.scheduler = Some(Scheduler::parse(value).ok_or_else(Scheduler::expected)?);
        }
        AnnotationKey::Persistence => {
            lb.persistence = match value {
                "none" => None,
                _ => Some(Persistence {
                    key: PersistenceKey::parse(value)
                        .ok_or_else(|| with_none(PersistenceKey::expected()))?,
                    timeout_seconds: persistence_timeout(spec),
                }),
            };
        }
        AnnotationKey::Mode => lb.mode = Some(NatMode::parse(value).ok_or_else(NatMode::expected)?),
        AnnotationKey::Helper => {
            lb.helper = match value {
                "none" => None,
                _ => Some(Helper::parse(value).ok_or_else(|| with_none(Helper::expected()))?),
            };
        }
        AnnotationKey::Log => {
            lb.log = match value {
                "none" => None,
                _ => Some(LogPath::parse(value).ok_or_else(|| with_none(LogPath::expected()))?),
            };
        }
    }
    Ok(())
}

/// `spec.sessionAffinityConfig.clientIP.timeoutSeconds` when set and valid, else
/// kube-nftlb's default.
fn persistence_timeout(spec: &ServiceSpec) -> u32 {
    let timeout = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds);
    match timeout {
        Some(t @ 1..=86_400) => t as u32,
        _ => DEFAULT_PERSISTENCE_TIMEOUT_SECONDS,
    }
}
