//! [`LoadBalancing`] ↔ `localv1.LoadBalancing` (extension field 101 of `Service`, in both
//! streams). Each wire enum lists the model's values in the order of their `ALL` list,
//! from 1 on; 0 means not set. A value this build does not know (from a newer peer) is an
//! error naming the field.

use kpng_model::global::{
    Helper, LoadBalancing, LogPath, NatMode, Persistence, PersistenceKey, Scheduler,
};

use crate::localv1;
use crate::wire::WireError;

/// The wire number of `value` within `all`: its position from 1.
fn number<T: PartialEq + Copy>(all: &[(T, &str)], value: Option<T>) -> i32 {
    value.map_or(0, |v| all.iter().position(|(a, _)| *a == v).map_or(0, |i| i as i32 + 1))
}

/// The value numbered `n` within `all` (`None` for 0).
fn value<T: Copy>(
    all: &[(T, &str)],
    n: i32,
    path: &str,
    field: &str,
) -> Result<Option<T>, WireError> {
    match n {
        0 => Ok(None),
        n => usize::try_from(n - 1)
            .ok()
            .and_then(|i| all.get(i))
            .map(|(v, _)| Some(*v))
            .ok_or_else(|| WireError::new(path, field, format!("unknown value {n}"))),
    }
}

/// The wire form; `None` for a service without settings (old clients see nothing).
pub fn encode_load_balancing(lb: &LoadBalancing) -> Option<localv1::LoadBalancing> {
    if lb.is_default() {
        return None;
    }
    Some(localv1::LoadBalancing {
        scheduler: number(Scheduler::ALL, lb.scheduler),
        persistence: number(PersistenceKey::ALL, lb.persistence.map(|p| p.key)),
        persistence_timeout_seconds: lb.persistence.map_or(0, |p| p.timeout_seconds),
        mode: number(NatMode::ALL, lb.mode),
        helper: number(Helper::ALL, lb.helper),
        log: number(LogPath::ALL, lb.log),
    })
}

/// The settings from their wire form (absent: none).
pub fn decode_load_balancing(
    wire: Option<&localv1::LoadBalancing>,
    path: &str,
) -> Result<LoadBalancing, WireError> {
    let Some(wire) = wire else { return Ok(LoadBalancing::default()) };
    let key = value(PersistenceKey::ALL, wire.persistence, path, "loadBalancing.persistence")?;
    Ok(LoadBalancing {
        scheduler: value(Scheduler::ALL, wire.scheduler, path, "loadBalancing.scheduler")?,
        persistence: key
            .map(|key| Persistence { key, timeout_seconds: wire.persistence_timeout_seconds }),
        mode: value(NatMode::ALL, wire.mode, path, "loadBalancing.mode")?,
        helper: value(Helper::ALL, wire.helper, path, "loadBalancing.helper")?,
        log: value(LogPath::ALL, wire.log, path, "loadBalancing.log")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use localv1::load_balancing as wire;

    /// The proto's names spell the annotation values: its numbering is the model's order.
    #[test]
    fn wire_enums_follow_the_models_order() {
        let name = |prefix: &str, text: &str| {
            format!("{prefix}_{}", text.to_uppercase().replace([' ', '-'], "_"))
        };
        for (i, (_, text)) in Scheduler::ALL.iter().enumerate() {
            let w = wire::Scheduler::try_from(i as i32 + 1).unwrap();
            assert_eq!(w.as_str_name(), name("SCHEDULER", text));
        }
        for (i, (_, text)) in PersistenceKey::ALL.iter().enumerate() {
            let w = wire::PersistenceKey::try_from(i as i32 + 1).unwrap();
            assert_eq!(w.as_str_name(), name("PERSISTENCE", text));
        }
        for (i, (_, text)) in NatMode::ALL.iter().enumerate() {
            let w = wire::NatMode::try_from(i as i32 + 1).unwrap();
            assert_eq!(w.as_str_name(), name("MODE", text));
        }
        for (i, (_, text)) in Helper::ALL.iter().enumerate() {
            let w = wire::Helper::try_from(i as i32 + 1).unwrap();
            assert_eq!(w.as_str_name(), name("HELPER", text));
        }
        for (i, (_, text)) in LogPath::ALL.iter().enumerate() {
            let w = wire::LogPath::try_from(i as i32 + 1).unwrap();
            assert_eq!(w.as_str_name(), name("LOG", text));
        }
    }

    #[test]
    fn every_setting_round_trips_and_unknown_numbers_are_named() {
        for (helper, _) in Helper::ALL {
            for (key, _) in PersistenceKey::ALL {
                let lb = LoadBalancing {
                    scheduler: Some(Scheduler::SymmetricHash),
                    persistence: Some(Persistence { key: *key, timeout_seconds: 30 }),
                    mode: Some(NatMode::Dnat),
                    helper: Some(*helper),
                    log: Some(LogPath::Output),
                };
                let wire = encode_load_balancing(&lb);
                assert_eq!(decode_load_balancing(wire.as_ref(), "ns/a").unwrap(), lb);
            }
        }
        assert_eq!(encode_load_balancing(&LoadBalancing::default()), None);
        assert_eq!(decode_load_balancing(None, "ns/a").unwrap(), LoadBalancing::default());
        let newer = localv1::LoadBalancing { mode: 9, ..Default::default() };
        let error = decode_load_balancing(Some(&newer), "ns/a").unwrap_err().to_string();
        assert!(error.contains("ns/a") && error.contains("loadBalancing.mode"), "{error}");
    }
}
