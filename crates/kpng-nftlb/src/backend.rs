//! [`NftlbBackend`]: change sets in, the fewest nftlb calls out.
//!
//! kpng owns the nftlb daemon it drives, as kube-nftlb does: at start (and whenever it
//! does not know what nftlb holds: a refused call, drift) it lists nftlb's farms and makes
//! them what the node state asks, so a restart over identical farms calls nothing and
//! farms kpng does not want go. After that a change set touches only the farms of the
//! services it changed: a farm is created or deleted whole, an endpoint change adds or
//! deletes that backend only (a farm is recreated only when its address, port, protocol
//! or mode changes). nftlb applies each call on its own, so a failure part way leaves the
//! calls before it applied; the retry lists the farms again and converges.
//!
//! After each change set kpng checks the kernel: every farm it created or changed must
//! have its `nat-<farm>` chain sending to each of its backends. nftlb 1.0.7 answers
//! success for farms it never installs (past 1,024); that is reported as the failure of
//! the change set, with the farm named.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use kpng_backend::{Backend, BackendError, ChangeSet};
use kpng_model::local::LocalServiceState;
use kpng_model::{LocalState, ServiceKey};

use crate::check::{Installed, mismatch};
use crate::client::Client;
use crate::error::NftlbError;
use kpng_model::global::{AnnotationKey, LoadBalancing, NatMode};

use crate::farm::{Direct, Farm, Listing, backends_body, create_body, farms_of, unsupported};
use crate::link::LinkLayer;

/// nftlb's API, as the backend calls it.
pub trait Api: Send {
    /// One call; the answer's body when nftlb accepted it.
    fn call(&mut self, method: &str, path: &str, body: &str) -> Result<String, NftlbError>;
}

impl Api for Client {
    fn call(&mut self, method: &str, path: &str, body: &str) -> Result<String, NftlbError> {
        Client::call(self, method, path, body)
    }
}

/// Lists nftlb's farms.
pub fn list_farms(api: &mut dyn Api) -> Result<BTreeMap<String, Farm>, NftlbError> {
    let body = api.call("GET", "/farms", "")?;
    let listing: Listing = serde_json::from_str(&body)
        .map_err(|source| NftlbError::Decode { what: "GET /farms".into(), source })?;
    Ok(listing.farms.into_iter().map(|f| (f.name.clone(), Farm::from(f))).collect())
}

/// Deletes every farm of the daemon (kpng's: it owns the daemon); returns their names.
pub fn cleanup(api: &mut dyn Api) -> Result<Vec<String>, NftlbError> {
    let farms = list_farms(api)?;
    for name in farms.keys() {
        api.call("DELETE", &format!("/farms/{name}"), "")?;
    }
    Ok(farms.into_keys().collect())
}

/// The most farms created in one call.
pub const CREATE_CHUNK: usize = 200;

/// The nftlb backend.
pub struct NftlbBackend {
    api: Box<dyn Api>,
    installed: Box<dyn Installed>,
    /// What nftlb holds, when known.
    farms: Option<BTreeMap<String, Farm>>,
    /// The farms of each service.
    by_service: HashMap<ServiceKey, Vec<String>>,
    /// Services whose unsupported features were logged.
    warned: BTreeSet<ServiceKey>,
    /// Calls made, for tests and logs.
    calls: u64,
    /// For `dsr` farms: the interface clients arrive on, and how backends are resolved.
    direct: Option<(String, Box<dyn LinkLayer>)>,
}

impl NftlbBackend {
    /// A backend calling `api` and checking the kernel through `installed`.
    pub fn new(api: Box<dyn Api>, installed: Box<dyn Installed>) -> NftlbBackend {
        NftlbBackend {
            api,
            installed,
            farms: None,
            by_service: HashMap::new(),
            warned: BTreeSet::new(),
            calls: 0,
            direct: None,
        }
    }

    /// Services with `mode: dsr` get `dsr` farms hooked on `iface`, the interface clients
    /// arrive on, their backends resolved by `links` (without it they are `snat` farms,
    /// and the mode is reported unsupported).
    pub fn with_direct_return(mut self, iface: String, links: Box<dyn LinkLayer>) -> Self {
        self.direct = Some((iface, links));
        self
    }

    /// The farms of `service`, `dsr` farms with their link layer resolved.
    fn farms_of(&mut self, service: &LocalServiceState) -> Result<Vec<Farm>, NftlbError> {
        let mut farms = farms_of(service, self.direct.is_some());
        let Some((iface, links)) = self.direct.as_mut() else { return Ok(farms) };
        for farm in farms.iter_mut().filter(|f| f.vip.mode == "dsr" && !f.backends.is_empty()) {
            let ips: Vec<IpAddr> =
                farm.backends.values().filter_map(|b| b.ip_addr.parse().ok()).collect();
            let resolved = links
                .resolve(&ips)
                .map_err(|why| NftlbError::LinkLayer { farm: farm.name.clone(), why })?;
            let backends = farm
                .backends
                .values()
                .filter_map(|b| {
                    let ip: IpAddr = b.ip_addr.parse().ok()?;
                    Some((b.name.clone(), resolved.macs.get(&ip)?.clone()))
                })
                .collect();
            farm.direct = Some(Direct {
                iface: iface.clone(),
                oface: resolved.oface,
                ether_addr: resolved.oface_mac,
                backends,
            });
        }
        Ok(farms)
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    fn call(&mut self, method: &str, path: &str, body: &str) -> Result<(), NftlbError> {
        self.calls += 1;
        self.api.call(method, path, body).map(drop)
    }

    fn warn_unsupported(&mut self, state: &LocalState, key: &ServiceKey) {
        let Some(service) = state.services.get(key) else {
            self.warned.remove(key);
            return;
        };
        let what = unsupported(service);
        if what.is_empty() {
            self.warned.remove(key);
        } else if self.warned.insert(key.clone()) {
            tracing::warn!(service = %key, unsupported = %what.join(", "), "to-nftlb proxies the cluster IPs only; these are not enforced");
        }
    }

    /// Brings farm `name` from `old` to `new` but for its creation, which is returned for
    /// [`Self::sync`] to send with the others; returns too whether the kernel must be
    /// checked.
    fn converge<'f>(
        &mut self,
        old: Option<&Farm>,
        new: Option<&'f Farm>,
    ) -> Result<(Option<&'f Farm>, bool), NftlbError> {
        match (old, new) {
            (None, None) => Ok((None, false)),
            (Some(old), None) => {
                self.call("DELETE", &format!("/farms/{}", old.name), "")?;
                Ok((None, false))
            }
            (old, Some(new)) => {
                if let Some(old) = old.filter(|old| old.vip != new.vip) {
                    self.call("DELETE", &format!("/farms/{}", old.name), "")?;
                }
                let Some(old) = old.filter(|old| old.vip == new.vip) else {
                    return Ok((Some(new), true));
                };
                let gone: Vec<&String> = old
                    .backends
                    .iter()
                    .filter(|(name, b)| new.backends.get(*name) != Some(b))
                    .map(|(name, _)| name)
                    .collect();
                let added: Vec<_> = new
                    .backends
                    .iter()
                    .filter(|(name, b)| old.backends.get(*name) != Some(b))
                    .map(|(_, b)| b)
                    .collect();
                for name in &gone {
                    self.call("DELETE", &format!("/farms/{}/backends/{name}", new.name), "")?;
                }
                if !added.is_empty() {
                    self.call("POST", "/farms", &backends_body(new, &added))?;
                }
                Ok((None, !gone.is_empty() || !added.is_empty()))
            }
        }
    }

    /// Makes nftlb hold `wanted` in place of `have` (farm names of both); checks the kernel.
    /// New farms go in calls of up to [`CREATE_CHUNK`]: nftlb's cost per call grows with
    /// what it holds, so a start or a burst of new services costs few calls.
    fn sync(
        &mut self,
        have: &BTreeMap<String, Farm>,
        wanted: &BTreeMap<String, Farm>,
    ) -> Result<usize, NftlbError> {
        let names: BTreeSet<&String> = have.keys().chain(wanted.keys()).collect();
        let mut check = Vec::new();
        let mut create = Vec::new();
        let before = self.calls;
        for name in names {
            let (created, changed) = self.converge(have.get(name), wanted.get(name))?;
            create.extend(created);
            if changed {
                check.extend(wanted.get(name).filter(|f| !f.backends.is_empty()));
            }
        }
        for chunk in create.chunks(CREATE_CHUNK) {
            self.call("POST", "/farms", &create_body(chunk))?;
        }
        let chains = match check.is_empty() {
            true => BTreeMap::new(),
            false => self.installed.chains(&check)?,
        };
        for farm in check {
            if let Some(what) = mismatch(farm, chains.get(&farm.name).map(String::as_str)) {
                return Err(NftlbError::NotInstalled { farm: farm.name.clone(), what });
            }
        }
        Ok((self.calls - before) as usize)
    }

    fn all_farms(&mut self, state: &LocalState) -> Result<BTreeMap<String, Farm>, NftlbError> {
        self.by_service.clear();
        let mut wanted = BTreeMap::new();
        for (key, service) in &state.services {
            self.warn_unsupported(state, key);
            let farms = self.farms_of(service)?;
            self.by_service.insert(key.clone(), farms.iter().map(|f| f.name.clone()).collect());
            wanted.extend(farms.into_iter().map(|f| (f.name.clone(), f)));
        }
        Ok(wanted)
    }

    fn apply_inner(&mut self, changes: &ChangeSet<'_>) -> Result<usize, NftlbError> {
        let state = changes.state;
        let known = self.farms.take().filter(|_| !changes.is_reset());
        let Some(mut farms) = known else {
            let have = list_farms(&mut *self.api)?;
            let wanted = self.all_farms(state)?;
            let calls = self.sync(&have, &wanted)?;
            self.farms = Some(wanted);
            return Ok(calls);
        };
        let (keys, _) = changes.touched();
        let mut have = BTreeMap::new();
        let mut wanted = BTreeMap::new();
        for key in &keys {
            self.warn_unsupported(state, key);
            for name in self.by_service.remove(key).unwrap_or_default() {
                if let Some(farm) = farms.remove(&name) {
                    have.insert(name, farm);
                }
            }
            if let Some(service) = state.services.get(key) {
                let new = self.farms_of(service)?;
                self.by_service.insert(key.clone(), new.iter().map(|f| f.name.clone()).collect());
                wanted.extend(new.into_iter().map(|f| (f.name.clone(), f)));
            }
        }
        let calls = self.sync(&have, &wanted)?;
        farms.extend(wanted);
        self.farms = Some(farms);
        Ok(calls)
    }
}

impl Backend for NftlbBackend {
    fn name(&self) -> &'static str {
        crate::NAME
    }

    fn unsupported(&self, lb: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)> {
        // Direct server return needs the interface clients arrive on. nftlb's stateless
        // DNAT keeps the service port (no target port) and takes replies only on the
        // backends' interface.
        match lb.mode {
            Some(NatMode::Dsr) if self.direct.is_some() => Vec::new(),
            Some(mode @ (NatMode::StatelessDnat | NatMode::Dsr)) => {
                vec![(AnnotationKey::Mode, mode.as_str())]
            }
            _ => Vec::new(),
        }
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let start = std::time::Instant::now();
        match self.apply_inner(changes) {
            Ok(0) => Ok(()),
            Ok(calls) => {
                let farms = self.farms.as_ref().map_or(0, BTreeMap::len);
                tracing::info!(calls, farms, took = ?start.elapsed(), "nftlb farms updated");
                Ok(())
            }
            Err(error) => {
                // Some calls may have been applied: list the farms before the next change.
                self.farms = None;
                Err(error.into_backend_error())
            }
        }
    }

    fn verify(&mut self) -> Result<bool, BackendError> {
        let Some(farms) = &self.farms else { return Ok(true) };
        let listed = list_farms(&mut *self.api).map_err(NftlbError::into_backend_error)?;
        if &listed == farms {
            return Ok(true);
        }
        let differs = farms
            .keys()
            .chain(listed.keys())
            .find(|name| farms.get(*name) != listed.get(*name))
            .cloned()
            .unwrap_or_default();
        tracing::warn!(farm = %differs, "nftlb's farms changed behind kpng's back; repairing");
        self.farms = None;
        Ok(false)
    }
}

#[cfg(test)]
mod tests;
