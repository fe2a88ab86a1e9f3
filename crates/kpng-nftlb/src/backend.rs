//! [`NftlbBackend`]: change sets in, the fewest nftlb calls out; an instance of kpng's
//! backend template ([`kpng_backend::reconcile`]): [`NftlbRender`] turns a service into
//! farms (objects keyed by farm name), [`NftlbKernel`] lists them back and commits a plan
//! as nftlb calls.
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

use kpng_backend::reconcile::{
    Filed, Kernel, Objects, Pack, Plan, Rank, Reconciler, Render, Unit, Wanted,
};
use kpng_model::local::LocalServiceState;
use kpng_model::{NodeState, ServiceKey};

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

/// The render: a service's farms, `dsr` farms with their link layer resolved.
pub struct NftlbRender {
    /// Services whose unsupported features were logged.
    warned: BTreeSet<ServiceKey>,
    /// For `dsr` farms: the interface clients arrive on, and how backends are resolved.
    direct: Option<(String, Box<dyn LinkLayer>)>,
}

impl NftlbRender {
    fn warn_unsupported(&mut self, service: &LocalServiceState) {
        let key = &service.service.key;
        let what = unsupported(service);
        if what.is_empty() {
            self.warned.remove(key);
        } else if self.warned.insert(key.clone()) {
            tracing::warn!(service = %key, unsupported = %what.join(", "), "to-nftlb proxies the cluster IPs only; these are not enforced");
        }
    }
}

/// A farm's name orders nothing: farms are independent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FarmName(pub String);

impl Filed for FarmName {}

impl Rank for FarmName {}

/// Kept whole by the template: one farm per service.
impl Pack for FarmName {}

impl Pack for Farm {}

impl Render for NftlbRender {
    type Key = FarmName;
    type Value = Farm;
    type Facts = ();
    type Error = NftlbError;

    fn facts(&self, _state: &dyn NodeState) {}

    fn service(
        &mut self,
        _facts: &(),
        service: &LocalServiceState,
        _held: &dyn kpng_backend::reconcile::Lookup<FarmName, Farm>,
    ) -> Result<Wanted<FarmName, Farm>, NftlbError> {
        self.warn_unsupported(service);
        let mut farms = farms_of(service, self.direct.is_some());
        if let Some((iface, links)) = self.direct.as_mut() {
            for farm in farms.iter_mut().filter(|f| f.vip.mode == "dsr" && !f.backends.is_empty()) {
                resolve(farm, iface, &mut **links)?;
            }
        }
        Ok(Wanted::objects(farms.into_iter().map(|f| (FarmName(f.name.clone()), f))))
    }

    fn forget(&mut self, key: &ServiceKey) {
        self.warned.remove(key);
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
}

/// Fills a `dsr` farm's link layer: `iface`, and its backends' addresses from `links`.
fn resolve(farm: &mut Farm, iface: &str, links: &mut dyn LinkLayer) -> Result<(), NftlbError> {
    let ips: Vec<IpAddr> = farm.backends.values().filter_map(|b| b.ip_addr.parse().ok()).collect();
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
        iface: iface.to_string(),
        oface: resolved.oface,
        ether_addr: resolved.oface_mac,
        backends,
    });
    Ok(())
}

/// The kernel: nftlb's farms, listed back and changed by calls. nftlb applies each call on
/// its own, so a plan is applied a farm at a time ([`Unit::Write`]); after the calls, every
/// farm created or changed is checked in the kernel.
pub struct NftlbKernel {
    api: Box<dyn Api>,
    installed: Box<dyn Installed>,
    /// Calls made, for tests and logs.
    calls: u64,
}

impl NftlbKernel {
    /// The daemon behind `api`, its kernel checked through `installed`.
    pub fn new(api: Box<dyn Api>, installed: Box<dyn Installed>) -> Self {
        NftlbKernel { api, installed, calls: 0 }
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    fn call(&mut self, method: &str, path: &str, body: &str) -> Result<(), NftlbError> {
        self.calls += 1;
        self.api.call(method, path, body).map(drop)
    }

    /// Brings farm `name` from `old` to `new` but for its creation, which is returned to
    /// be sent with the others; returns too whether the kernel must be checked.
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
}

impl Kernel for NftlbKernel {
    type Key = FarmName;
    type Value = Farm;
    type Error = NftlbError;

    const UNIT: Unit = Unit::Write;
    const WHAT: &'static str = "nftlb farms";
    const APPLIED: &'static str = "updated";

    fn read(&mut self) -> Result<Option<HashMap<FarmName, Farm>>, NftlbError> {
        let farms = list_farms(&mut *self.api)?;
        Ok(Some(farms.into_iter().map(|(name, farm)| (FarmName(name), farm)).collect()))
    }

    /// Farms go first, then farms are changed, and new farms come in calls of up to
    /// [`CREATE_CHUNK`] (nftlb's cost per call grows with what it holds, so a start or a
    /// burst of new services costs few calls); then the kernel is checked.
    fn commit(
        &mut self,
        plan: &Plan<FarmName, Farm>,
        _after: &Objects<FarmName, Farm>,
    ) -> Result<(), NftlbError> {
        for (_, old) in &plan.deletes {
            self.converge(Some(old), None)?;
        }
        let mut check = Vec::new();
        let mut create = Vec::new();
        for (_, old, new) in &plan.upserts {
            match self.converge(old.as_ref(), Some(new))? {
                (Some(created), _) => create.push(created),
                (None, true) if !new.backends.is_empty() => check.push(new),
                (None, _) => {}
            }
        }
        for chunk in create.chunks(CREATE_CHUNK) {
            self.call("POST", "/farms", &create_body(chunk))?;
        }
        check.extend(create.iter().filter(|f| !f.backends.is_empty()));
        let chains = match check.is_empty() {
            true => BTreeMap::new(),
            false => self.installed.chains(&check)?,
        };
        for farm in check {
            if let Some(what) = mismatch(farm, chains.get(&farm.name).map(String::as_str)) {
                return Err(NftlbError::NotInstalled { farm: farm.name.clone(), what });
            }
        }
        Ok(())
    }
}

/// The nftlb backend.
pub struct NftlbBackend {
    inner: Reconciler<NftlbRender, NftlbKernel>,
}

impl NftlbBackend {
    /// A backend calling `api` and checking the kernel through `installed`.
    pub fn new(api: Box<dyn Api>, installed: Box<dyn Installed>) -> NftlbBackend {
        let render = NftlbRender { warned: BTreeSet::new(), direct: None };
        let kernel = NftlbKernel::new(api, installed);
        NftlbBackend { inner: Reconciler::new(crate::NAME, render, kernel) }
    }

    /// Services with `mode: dsr` get `dsr` farms hooked on `iface`, the interface clients
    /// arrive on, their backends resolved by `links` (without it they are `snat` farms,
    /// and the mode is reported unsupported).
    pub fn with_direct_return(mut self, iface: String, links: Box<dyn LinkLayer>) -> Self {
        self.inner.render_mut().direct = Some((iface, links));
        self
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.inner.kernel().calls()
    }

    /// The template's counters.
    pub fn stats(&self) -> std::sync::Arc<kpng_backend::reconcile::Stats> {
        self.inner.stats()
    }
}

kpng_backend::delegate_backend!(NftlbBackend, inner);

#[cfg(test)]
mod tests;
