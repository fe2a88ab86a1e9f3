//! Load-balancing settings a dataplane cannot enforce: each backend says which
//! ([`Backend::unsupported`]), and [`UnsupportedSettings`]
//! logs them once per backend, service and settings, the same way for every backend.

use std::collections::HashMap;

use kpng_model::ServiceKey;
use kpng_model::global::{AnnotationKey, LOAD_BALANCER_ANNOTATION_PREFIX, LoadBalancing};

use crate::{Backend, ChangeSet};

/// What was reported, so a setting is logged once per backend and service while it lasts.
#[derive(Debug, Default)]
pub struct UnsupportedSettings {
    reported: HashMap<(&'static str, ServiceKey), LoadBalancing>,
}

impl UnsupportedSettings {
    /// Logs the settings of the services in `changes` that `backend` cannot enforce, unless
    /// already logged for these settings; returns how many services were logged.
    pub fn check(&mut self, backend: &dyn Backend, changes: &ChangeSet<'_>) -> usize {
        let name = backend.name();
        let state = changes.state;
        let settings: Vec<(ServiceKey, Option<LoadBalancing>)> = if changes.is_reset() {
            state
                .services()
                .map(|s| (s.service.key.clone(), Some(s.service.load_balancing)))
                .collect()
        } else {
            let touched = changes.touched().0.into_iter();
            touched
                .map(|k| (k.clone(), state.service(&k).map(|s| s.service.load_balancing)))
                .collect()
        };
        let mut logged = 0;
        for (key, lb) in settings {
            let Some(lb) = lb else {
                self.reported.remove(&(name, key));
                continue;
            };
            let unsupported = backend.unsupported(&lb);
            let id = (name, key);
            if unsupported.is_empty() {
                self.reported.remove(&id);
                continue;
            }
            if self.reported.get(&id) == Some(&lb) {
                continue;
            }
            for (setting, value) in &unsupported {
                tracing::warn!(
                    backend = name,
                    service = %id.1,
                    annotation = format!("{LOAD_BALANCER_ANNOTATION_PREFIX}{setting}"),
                    value,
                    "annotation not supported by this backend: the service is balanced as without it"
                );
            }
            self.reported.insert(id, lb);
            logged += 1;
        }
        logged
    }
}

/// Every setting that is set: what a backend that enforces none of them cannot enforce.
pub fn all_settings(lb: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)> {
    lb.annotations()
}

#[cfg(test)]
mod tests {
    use kpng_model::global::{Helper, LoadBalancing};
    use kpng_model::local::{LocalService, LocalServiceState};
    use kpng_model::{LocalState, Op};

    use super::*;
    use crate::BackendError;

    /// A backend that enforces no setting.
    struct Plain;

    impl Backend for Plain {
        fn name(&self) -> &'static str {
            "to-plain"
        }
        fn apply(&mut self, _: &ChangeSet<'_>) -> Result<(), BackendError> {
            Ok(())
        }
        fn unsupported(&self, lb: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)> {
            all_settings(lb)
        }
    }

    fn state(helper: Option<Helper>) -> LocalState {
        let service = LocalService {
            load_balancing: LoadBalancing { helper, ..LoadBalancing::default() },
            ..crate::bare_service("ns", "ftp")
        };
        let mut state = LocalState::default();
        let endpoints = Default::default();
        state.services.insert(service.key.clone(), LocalServiceState { service, endpoints });
        state
    }

    #[test]
    fn a_setting_is_reported_once_per_service_until_it_changes() {
        let mut reports = UnsupportedSettings::default();
        let ftp = state(Some(Helper::Ftp));
        assert_eq!(reports.check(&Plain, &ChangeSet::full(&ftp)), 1);
        assert_eq!(reports.check(&Plain, &ChangeSet::full(&ftp)), 0, "reported before");
        let ops = [Op::Set(kpng_model::Item::Service(
            ftp.services.values().next().unwrap().service.clone(),
        ))];
        assert_eq!(reports.check(&Plain, &ChangeSet::changes(&ops, &ftp)), 0);
        let tftp = state(Some(Helper::Tftp));
        assert_eq!(reports.check(&Plain, &ChangeSet::changes(&ops, &tftp)), 1, "a new value");
        let plain = state(None);
        assert_eq!(reports.check(&Plain, &ChangeSet::full(&plain)), 0);
        assert_eq!(reports.check(&Plain, &ChangeSet::full(&tftp)), 1, "again after it went");
    }
}
