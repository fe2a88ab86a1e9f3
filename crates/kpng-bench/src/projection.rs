//! The projection scenario: the whole node state projected from the global model, as every
//! cold start and every zone change does before the backend sees anything. Timed in the
//! process, on every core as kpng runs it, and once per repetition so the spread shows.

use std::time::{Duration, Instant};

use kpng_local::project_node_state;
use kpng_model::GlobalModel;
use kpng_testkit::generate::ClusterSpec;

use crate::cluster;

/// One size's projection times.
pub struct ProjectionRow {
    /// Services in the cluster.
    pub services: usize,
    /// Endpoints in the projected state (all services).
    pub endpoints: usize,
    /// Repetitions.
    pub repeat: usize,
    /// Fastest, median and slowest projection (ms).
    pub times: (f64, f64, f64),
}

/// Projects node `node-0`'s state of a generated cluster `repeat` times.
pub fn run(services: usize, endpoints: usize, repeat: usize) -> anyhow::Result<ProjectionRow> {
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let mut model = GlobalModel::new();
    for object in cluster::objects(&spec)? {
        model.apply(object);
    }
    let mut samples = Vec::with_capacity(repeat);
    let mut projected = 0;
    for _ in 0..repeat.max(1) {
        let start = Instant::now();
        let state = project_node_state(&model, "node-0");
        samples.push(start.elapsed());
        projected = state.services.values().map(|s| s.endpoints.len()).sum();
        // Dropped outside the timed part: a cold start keeps what it projects.
        drop(state);
    }
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let times = (ms(samples[0]), ms(samples[samples.len() / 2]), ms(samples[samples.len() - 1]));
    Ok(ProjectionRow { services, endpoints: projected, repeat: samples.len(), times })
}

/// Prints the projection table.
pub fn print(rows: &[ProjectionRow]) {
    println!("Projection: the whole node state from the model (every core, in process)");
    println!(
        "{:>8} {:>10} {:>7} | {:>8} {:>11} {:>8}",
        "services", "endpoints", "repeat", "min(ms)", "median(ms)", "max(ms)"
    );
    for row in rows {
        let (min, median, max) = row.times;
        println!(
            "{:>8} {:>10} {:>7} | {:>8.1} {:>11.1} {:>8.1}",
            row.services, row.endpoints, row.repeat, min, median, max
        );
    }
}
