//! The size of `to-nft --aggregator`'s whole-state publication: what `kpng aggregate`
//! receives from kpng at every start and after every failure, and what its bound on a
//! producer's unacknowledged bytes (`--max-unacknowledged-bytes`) must hold twice over.
//! Built in the process: the cluster is projected, the nftables backend plans its tables
//! from nothing, and the plan is translated and encoded as the aggregator client sends it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use kpng_aggregator::{Publication, Update};

use kpng_nft::plan::{AllElements, Plan};
use kpng_nft::{Kernel, KernelContents, NftBackend, NftError, NftOptions};
use kpng_runner::{Backend, ChangeSet};
use kpng_testkit::generate::ClusterSpec;
use prost::Message;

use crate::cluster;

/// One size's whole publication.
pub struct PublicationRow {
    /// Services in the cluster.
    pub services: usize,
    /// Bytes of the encoded `aggregatorv1.Publication`.
    pub bytes: usize,
}

/// A kernel that takes whole tables, as the aggregator's client does, and only measures
/// them.
struct Sizing(Arc<AtomicUsize>);

impl Kernel for Sizing {
    fn commit(&mut self, _plan: &Plan<'_>) -> Result<(), NftError> {
        Ok(())
    }

    fn read(&mut self) -> Result<Option<KernelContents>, NftError> {
        Ok(None)
    }

    fn replace(&mut self, layout: &Plan<'_>, elements: AllElements<'_>) -> Result<(), NftError> {
        let (state, _) = kpng_nft::aggregated::translate_whole(layout, elements)?;
        let publication = Publication { revision: 1, updates: vec![Update::Whole(state)] };
        let wire = kpng_aggregator::wire::publication_to_wire("kpng", publication);
        self.0.fetch_max(wire.encoded_len(), Ordering::Relaxed);
        Ok(())
    }

    fn publishes_whole(&self) -> bool {
        true
    }
}

/// The whole publication of node `node-0` of a generated cluster.
pub fn run(services: usize, endpoints: usize) -> anyhow::Result<PublicationRow> {
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (_model, projector) = cluster::projected(&spec)?;
    let bytes = Arc::new(AtomicUsize::new(0));
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(Sizing(bytes.clone())));
    backend.apply(&ChangeSet::full(projector.state())).context("the whole publication")?;
    Ok(PublicationRow { services, bytes: bytes.load(Ordering::Relaxed) })
}

/// Prints the table.
pub fn print(rows: &[PublicationRow]) {
    println!("to-nft --aggregator: the whole-state publication, encoded");
    println!("{:>8} | {:>12} {:>9} | {:>12}", "services", "bytes", "MiB", "bytes/service");
    for row in rows {
        let per = row.bytes as f64 / row.services.max(1) as f64;
        let mib = row.bytes as f64 / f64::from(1 << 20);
        println!("{:>8} | {:>12} {:>9.1} | {:>12.0}", row.services, row.bytes, mib, per);
    }
}
