//! How a service balances its load: the settings kube-nftlb reads from the annotations
//! `service.kubernetes.io/kube-nftlb-load-balancer-<key>`, typed.
//!
//! Sources parse the annotations into [`LoadBalancing`]; nothing past a source sees their
//! text. The values keep kube-nftlb's spelling ([`Scheduler::ALL`] and the like list them,
//! with the text each is written as), so a Service annotated for kube-nftlb means the same
//! to kpng.

use serde::{Deserialize, Serialize};

/// The prefix of the annotations read into [`LoadBalancing`]; the rest of the key names the
/// setting ([`AnnotationKey`]).
pub const LOAD_BALANCER_ANNOTATION_PREFIX: &str = "service.kubernetes.io/kube-nftlb-load-balancer-";

/// How long a client sticks to its endpoint under `persistence` when the Service sets no
/// `sessionAffinityConfig.clientIP.timeoutSeconds` (kube-nftlb's default).
pub const DEFAULT_PERSISTENCE_TIMEOUT_SECONDS: u32 = 60;

/// Declares a setting's values with the text of each in annotations.
macro_rules! annotation_values {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, with its text in annotations.
            pub const ALL: &'static [($name, &'static str)] = &[$(($name::$variant, $text),)+];

            /// The value's text in annotations.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value written `text` in an annotation.
            pub fn parse(text: &str) -> Option<$name> {
                Self::ALL.iter().find(|(_, t)| *t == text).map(|(v, _)| *v)
            }

            /// The accepted texts, for messages: `"a", "b" or "c"`.
            pub fn expected() -> String {
                expected(Self::ALL.iter().map(|(_, t)| *t))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// `"a", "b" or "c"`.
fn expected<'a>(texts: impl Iterator<Item = &'a str>) -> String {
    let quoted: Vec<String> = texts.map(|t| format!("{t:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.concat(),
    }
}

annotation_values! {
    /// The settings, by the key that follows [`LOAD_BALANCER_ANNOTATION_PREFIX`].
    AnnotationKey {
        /// How a new connection picks its endpoint.
        Scheduler = "scheduler",
        /// What a client sticks by, or what `hash` hashes.
        Persistence = "persistence",
        /// Address translation towards the endpoint.
        Mode = "mode",
        /// A conntrack helper for the protocol.
        Helper = "helper",
        /// Logging of new connections.
        Log = "log",
    }
}

annotation_values! {
    /// How a new connection picks its endpoint (`scheduler`); without one, uniformly at
    /// random as upstream kube-proxy does. Later packets follow conntrack.
    Scheduler {
        /// Each endpoint in turn.
        RoundRobin = "rr",
        /// A hash of addresses and ports that is the same in both directions of a flow.
        SymmetricHash = "symhash",
        /// A hash of the [`Persistence`] key: a client always reaches the same endpoint
        /// while the endpoints stay the same, with no state.
        Hash = "hash",
    }
}

annotation_values! {
    /// What identifies a client (`persistence`).
    PersistenceKey {
        /// The source address.
        SrcIp = "srcip",
        /// The source port.
        SrcPort = "srcport",
        /// The source link-layer address (only known for traffic arriving on Ethernet).
        SrcMac = "srcmac",
        /// The source address and port.
        SrcIpSrcPort = "srcip srcport",
        /// The source address and the destination port.
        SrcIpDstPort = "srcip dstport",
    }
}

annotation_values! {
    /// Address translation towards the endpoint (`mode`).
    NatMode {
        /// Always masquerade: the endpoint sees the node's address.
        Snat = "snat",
        /// Never masquerade: the endpoint sees the client's address (a pod reaching itself
        /// through the service is still masqueraded, or it could not answer).
        Dnat = "dnat",
        /// Stateless DNAT (kube-nftlb's `stlsdnat`): both directions rewritten in the
        /// packet without conntrack, each packet hashed to its endpoint (`to-nft` only).
        StatelessDnat = "stlsdnat",
        /// Direct server return: an unchanged copy of each packet goes to the endpoint's
        /// link-layer address, and the endpoint answers the client directly (`to-nft` only).
        Dsr = "dsr",
    }
}

annotation_values! {
    /// A conntrack helper (`helper`): protocols that open related connections.
    Helper {
        /// Amanda backups.
        Amanda = "amanda",
        /// FTP.
        Ftp = "ftp",
        /// H.323.
        H323 = "h323",
        /// IRC DCC.
        Irc = "irc",
        /// NetBIOS name service.
        NetbiosNs = "netbios-ns",
        /// PPTP.
        Pptp = "pptp",
        /// SANE scanners.
        Sane = "sane",
        /// SIP.
        Sip = "sip",
        /// SNMP.
        Snmp = "snmp",
        /// TFTP.
        Tftp = "tftp",
    }
}

annotation_values! {
    /// Where new connections are logged (`log`).
    LogPath {
        /// Connections the node itself opens.
        Output = "output",
        /// Connections arriving from elsewhere.
        Forward = "forward",
    }
}

/// Stickiness: a client keeps its endpoint until it makes no new connection for the
/// timeout. With [`Scheduler::Hash`] the key is what is hashed and there is no timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Persistence {
    /// What identifies a client.
    pub key: PersistenceKey,
    /// Idle seconds after which the client is forgotten.
    pub timeout_seconds: u32,
}

/// A service's load-balancing settings. The default is what every unannotated service gets.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct LoadBalancing {
    /// How a new connection picks its endpoint; `None`: uniformly at random.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<Scheduler>,
    /// Stickiness (or, with [`Scheduler::Hash`], the hash key). When set it wins over
    /// `sessionAffinity: ClientIP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence: Option<Persistence>,
    /// Masquerading towards the endpoints; `None`: kube-proxy's rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<NatMode>,
    /// A conntrack helper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helper: Option<Helper>,
    /// Logging of new connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<LogPath>,
}

impl LoadBalancing {
    /// No setting: the service is balanced as any other.
    pub fn is_default(&self) -> bool {
        *self == LoadBalancing::default()
    }

    /// The settings that are set, as `(key, value)` annotation texts, in key order.
    pub fn annotations(&self) -> Vec<(AnnotationKey, &'static str)> {
        [
            self.scheduler.map(|s| (AnnotationKey::Scheduler, s.as_str())),
            self.persistence.map(|p| (AnnotationKey::Persistence, p.key.as_str())),
            self.mode.map(|m| (AnnotationKey::Mode, m.as_str())),
            self.helper.map(|h| (AnnotationKey::Helper, h.as_str())),
            self.log.map(|l| (AnnotationKey::Log, l.as_str())),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_reads_back_from_its_text() {
        for (value, text) in Scheduler::ALL {
            assert_eq!(Scheduler::parse(text), Some(*value));
            assert_eq!(value.to_string(), *text);
        }
        for (value, text) in PersistenceKey::ALL {
            assert_eq!(PersistenceKey::parse(text), Some(*value));
        }
        for (value, text) in Helper::ALL {
            assert_eq!(Helper::parse(text), Some(*value));
        }
        assert_eq!(Helper::ALL.len(), 10);
        assert_eq!(NatMode::parse("SNAT"), None);
        assert_eq!(LogPath::expected(), r#""output" or "forward""#);
        assert_eq!(AnnotationKey::parse("mode"), Some(AnnotationKey::Mode));
    }

    #[test]
    fn only_settings_that_are_set_are_listed() {
        assert!(LoadBalancing::default().is_default());
        let lb = LoadBalancing {
            scheduler: Some(Scheduler::Hash),
            persistence: Some(Persistence {
                key: PersistenceKey::SrcIpDstPort,
                timeout_seconds: 60,
            }),
            log: Some(LogPath::Forward),
            ..LoadBalancing::default()
        };
        assert_eq!(
            lb.annotations(),
            [
                (AnnotationKey::Scheduler, "hash"),
                (AnnotationKey::Persistence, "srcip dstport"),
                (AnnotationKey::Log, "forward")
            ]
        );
    }
}
