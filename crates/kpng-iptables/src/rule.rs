//! Rules as typed values, and their one text form: the line `iptables-save` prints for them
//! (so what kpng committed and what the kernel holds compare as text without parsing).
//!
//! The order of a rule's parts is the order `iptables-save` uses, for both the nf_tables
//! and the legacy variant: source, destination, input interface, protocol, then matches in
//! the order given, then the target.

use std::fmt::{self, Write};
use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, Protocol};

use crate::names::ChainName;

/// An address match: a network, or an address under an arbitrary (possibly non-contiguous)
/// mask, which the dispatch chains use to shard by the low bits of an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Addr {
    /// A network (`10.96.0.10/32`).
    Net(IpNet),
    /// `address/mask`, the mask in address form (`0.0.0.5/0.0.0.15`, `::5/::f`).
    Masked(IpAddr, IpAddr),
}

impl Addr {
    /// One host.
    pub fn host(ip: IpAddr) -> Addr {
        Addr::Net(IpNet::from(ip))
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Net(net) => write!(f, "{}/{}", net.network(), net.prefix_len()),
            Addr::Masked(ip, mask) => write!(f, "{ip}/{mask}"),
        }
    }
}

/// A match after the built-in ones, with its module.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Match {
    /// `-m <proto> --dport P` or `--dport A:B` (the rule's protocol must be set).
    Dport(Protocol, u16, Option<u16>),
    /// `-m addrtype --src-type LOCAL` (`src`) or `--dst-type LOCAL`.
    AddrTypeLocal {
        /// Match the source's type, else the destination's.
        src: bool,
    },
    /// `-m statistic --mode random --probability p`, `p` in 2⁻³¹ units (as the kernel
    /// stores it).
    Random(u32),
    /// `-m recent --rcheck --seconds T --reap --name N` (`Some(T)`), or `--set --name N`
    /// (`None`), keyed by the whole source address.
    Recent {
        /// The list's name.
        name: ChainName,
        /// The timeout to check, or `None` to record.
        check_seconds: Option<u32>,
        /// The family, for the mask's spelling.
        family: Family,
    },
    /// `-m mark [!] --mark M/M`.
    Mark {
        /// Negated.
        not: bool,
        /// The bit.
        bit: u32,
    },
    /// `-m conntrack --ctstate NEW`.
    CtStateNew,
    /// `-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT`: a connection starting here that
    /// no DNAT rule translated.
    CtStateNotDnat,
    /// `-m comment --comment C` (one word).
    Comment(&'static str),
}

/// What a rule does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// `-j CHAIN`.
    Jump(ChainName),
    /// `-j DNAT --to-destination ip:port`.
    Dnat(IpAddr, u16),
    /// `-j MARK --set-xmark bit/bit`.
    SetMark(u32),
    /// `-j MARK --set-xmark 0x0/bit`.
    ClearMark(u32),
    /// `-j MASQUERADE --random-fully`.
    Masquerade,
    /// `-j REJECT` with the family's port-unreachable.
    Reject(Family),
    /// `-j DROP`.
    Drop,
    /// `-j RETURN`.
    Return,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    /// `[!] -s`.
    pub src: Option<(bool, Addr)>,
    /// `[!] -d`.
    pub dst: Option<(bool, Addr)>,
    /// `[!] -i`, a name or a prefix ending in `+`.
    pub in_iface: Option<(bool, String)>,
    /// `-p`.
    pub proto: Option<Protocol>,
    /// Further matches, in order.
    pub matches: Vec<Match>,
    /// The target.
    pub target: Target,
}

impl Rule {
    /// A rule that only does `target`.
    pub fn to(target: Target) -> Rule {
        Rule { src: None, dst: None, in_iface: None, proto: None, matches: Vec::new(), target }
    }

    /// `-j chain`.
    pub fn jump(chain: &ChainName) -> Rule {
        Rule::to(Target::Jump(chain.clone()))
    }

    /// With a source.
    pub fn src(mut self, addr: Addr) -> Rule {
        self.src = Some((false, addr));
        self
    }

    /// With a source outside `addr`.
    pub fn not_src(mut self, addr: Addr) -> Rule {
        self.src = Some((true, addr));
        self
    }

    /// With a destination.
    pub fn dst(mut self, addr: Addr) -> Rule {
        self.dst = Some((false, addr));
        self
    }

    /// With a destination outside `addr`.
    pub fn not_dst(mut self, addr: Addr) -> Rule {
        self.dst = Some((true, addr));
        self
    }

    /// Arriving on `iface` (`name+` for a prefix).
    pub fn in_iface(mut self, iface: String) -> Rule {
        self.in_iface = Some((false, iface));
        self
    }

    /// Of `protocol`, to `port`.
    pub fn dport(mut self, protocol: Protocol, port: u16) -> Rule {
        self.proto = Some(protocol);
        self.matches.push(Match::Dport(protocol, port, None));
        self
    }

    /// Of `protocol`.
    pub fn proto(mut self, protocol: Protocol) -> Rule {
        self.proto = Some(protocol);
        self
    }

    /// With a further match.
    pub fn with(mut self, m: Match) -> Rule {
        self.matches.push(m);
        self
    }

    /// The chain this rule jumps to, if any.
    pub fn jumps_to(&self) -> Option<&ChainName> {
        match &self.target {
            Target::Jump(c) => Some(c),
            _ => None,
        }
    }
}

fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn not(negated: bool) -> &'static str {
    if negated { "! " } else { "" }
}

/// The probability `1/n` as the kernel stores it (2⁻³¹ units, rounded).
pub fn one_in(n: u32) -> u32 {
    ((f64::from(0x8000_0000u32) / f64::from(n)).round()) as u32
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Match::Dport(p, port, None) => write!(f, "-m {} --dport {port}", proto_name(*p)),
            Match::Dport(p, lo, Some(hi)) => write!(f, "-m {} --dport {lo}:{hi}", proto_name(*p)),
            Match::AddrTypeLocal { src: true } => f.write_str("-m addrtype --src-type LOCAL"),
            Match::AddrTypeLocal { src: false } => f.write_str("-m addrtype --dst-type LOCAL"),
            Match::Random(p) => {
                // What iptables-save prints: the stored value, to 11 decimals.
                let value = f64::from(*p) / f64::from(0x8000_0000u32);
                write!(f, "-m statistic --mode random --probability {value:.11}")
            }
            Match::Recent { name, check_seconds, family } => {
                let mask = match family {
                    Family::V4 => "255.255.255.255",
                    Family::V6 => "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                };
                match check_seconds {
                    Some(t) => write!(
                        f,
                        "-m recent --rcheck --seconds {t} --reap --name {name} --mask {mask} --rsource"
                    ),
                    None => write!(f, "-m recent --set --name {name} --mask {mask} --rsource"),
                }
            }
            Match::Mark { not: n, bit } => {
                write!(f, "-m mark {}--mark {bit:#x}/{bit:#x}", not(*n))
            }
            Match::CtStateNew => f.write_str("-m conntrack --ctstate NEW"),
            Match::CtStateNotDnat => {
                f.write_str("-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT")
            }
            Match::Comment(c) => write!(f, "-m comment --comment {c}"),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Jump(c) => write!(f, "-j {c}"),
            Target::Dnat(IpAddr::V4(ip), port) => write!(f, "-j DNAT --to-destination {ip}:{port}"),
            Target::Dnat(IpAddr::V6(ip), port) => {
                write!(f, "-j DNAT --to-destination [{ip}]:{port}")
            }
            Target::SetMark(bit) => write!(f, "-j MARK --set-xmark {bit:#x}/{bit:#x}"),
            Target::ClearMark(bit) => write!(f, "-j MARK --set-xmark 0x0/{bit:#x}"),
            Target::Masquerade => f.write_str("-j MASQUERADE --random-fully"),
            Target::Reject(Family::V4) => {
                f.write_str("-j REJECT --reject-with icmp-port-unreachable")
            }
            Target::Reject(Family::V6) => {
                f.write_str("-j REJECT --reject-with icmp6-port-unreachable")
            }
            Target::Drop => f.write_str("-j DROP"),
            Target::Return => f.write_str("-j RETURN"),
        }
    }
}

/// The rule as `iptables-save` prints it after `-A CHAIN `.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = String::new();
        if let Some((n, a)) = &self.src {
            let _ = write!(parts, "{}-s {a} ", not(*n));
        }
        if let Some((n, a)) = &self.dst {
            let _ = write!(parts, "{}-d {a} ", not(*n));
        }
        if let Some((n, i)) = &self.in_iface {
            let _ = write!(parts, "{}-i {i} ", not(*n));
        }
        if let Some(p) = self.proto {
            let _ = write!(parts, "-p {} ", proto_name(p));
        }
        for m in &self.matches {
            let _ = write!(parts, "{m} ");
        }
        write!(f, "{parts}{}", self.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(name: &str) -> ChainName {
        ChainName::new(name).unwrap()
    }

    #[test]
    fn rules_print_as_iptables_save_prints_them() {
        // Lines taken from `iptables-save` (nf_tables and legacy print them alike) after
        // restoring the same rules.
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cases = [
            (
                Rule::jump(&chain("KPNG-SH-5")).dst(Addr::Masked(ip("0.0.0.5"), ip("0.0.0.15"))),
                "-d 0.0.0.5/0.0.0.15 -j KPNG-SH-5",
            ),
            (
                Rule::jump(&chain("KPNG-SH-5"))
                    .not_dst(Addr::Net("127.0.0.0/8".parse().unwrap()))
                    .with(Match::AddrTypeLocal { src: false }),
                "! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j KPNG-SH-5",
            ),
            (
                Rule::jump(&chain("KPNG-MARK-MASQ"))
                    .dst(Addr::host(ip("10.96.0.5")))
                    .in_iface("cni0".into())
                    .dport(Protocol::Sctp, 80),
                "-d 10.96.0.5/32 -i cni0 -p sctp -m sctp --dport 80 -j KPNG-MARK-MASQ",
            ),
            (
                Rule::jump(&chain("KPNG-SEP-A")).with(Match::Random(one_in(3))),
                "-m statistic --mode random --probability 0.33333333349 -j KPNG-SEP-A",
            ),
            (
                Rule::to(Target::Dnat(ip("fd00:244::10"), 8080)).proto(Protocol::Tcp).with(
                    Match::Recent {
                        name: chain("KPNG-SEP-A"),
                        check_seconds: None,
                        family: Family::V6,
                    },
                ),
                "-p tcp -m recent --set --name KPNG-SEP-A --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource -j DNAT --to-destination [fd00:244::10]:8080",
            ),
            (
                Rule::to(Target::Return).with(Match::Mark { not: true, bit: 0x4000 }),
                "-m mark ! --mark 0x4000/0x4000 -j RETURN",
            ),
            (Rule::to(Target::ClearMark(0x4000)), "-j MARK --set-xmark 0x0/0x4000"),
            (
                Rule::to(Target::Reject(Family::V6))
                    .dst(Addr::host(ip("fd00:96::a")))
                    .dport(Protocol::Udp, 53),
                "-d fd00:96::a/128 -p udp -m udp --dport 53 -j REJECT --reject-with icmp6-port-unreachable",
            ),
        ];
        for (rule, text) in cases {
            assert_eq!(rule.to_string(), text);
        }
    }

    #[test]
    fn probabilities_are_the_kernels_quantised_values() {
        assert_eq!(
            Rule::to(Target::Drop).with(Match::Random(one_in(2))).to_string(),
            "-m statistic --mode random --probability 0.50000000000 -j DROP"
        );
        assert_eq!(one_in(1), 0x8000_0000);
    }
}
