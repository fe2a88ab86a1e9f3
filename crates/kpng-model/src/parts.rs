//! Whole-cluster work split over the machine's cores: at start-up the node state of tens of
//! thousands of services is projected, then rendered, on the way to the first commit.

/// Below this many items, the work stays on the calling thread.
const PARALLEL_FROM: usize = 2_000;

/// How many threads `items` items of whole-cluster work take: one per core (at most eight),
/// one below 2,000 items.
pub fn threads_for(items: usize) -> usize {
    match items < PARALLEL_FROM {
        true => 1,
        false => std::thread::available_parallelism().map_or(1, |n| n.get()).min(8),
    }
}

/// `each` over `items` on `threads` scoped threads, each taking a contiguous part, keeping
/// what it returns; the results come in the order of `items`. A panic in a part is resumed
/// in the caller.
pub fn filter_map_in_parts<T: Sync, U: Send>(
    items: &[T],
    threads: usize,
    each: impl Fn(&T) -> Option<U> + Sync,
) -> Vec<U> {
    let part = |part: &[T]| part.iter().filter_map(&each).collect::<Vec<U>>();
    if threads < 2 || items.is_empty() {
        return part(items);
    }
    std::thread::scope(|scope| {
        let parts: Vec<_> = (items.chunks(items.len().div_ceil(threads)))
            .map(|items| scope.spawn(|| part(items)))
            .collect();
        let parts = parts.into_iter().map(|part| part.join());
        parts
            .flat_map(|part| part.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_come_back_in_order() {
        let items: Vec<u32> = (0..1000).collect();
        let even = |n: &u32| n.is_multiple_of(2).then_some(n * 3);
        let one = filter_map_in_parts(&items, 1, even);
        assert_eq!(one.len(), 500);
        assert_eq!(one[..3], [0, 6, 12]);
        for threads in [2, 3, 7, 2000] {
            assert_eq!(filter_map_in_parts(&items, threads, even), one, "{threads} threads");
        }
        assert!(filter_map_in_parts(&items[..0], 4, even).is_empty());
        assert_eq!(threads_for(10), 1);
    }
}
