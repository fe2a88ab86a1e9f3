//! The file source's watch rules over real time: a content that drops most objects is
//! applied only if it persists for the hold time.

use std::time::Duration;

use kpng_model::{GlobalModel, Kind};
use kpng_sources::ConvertOptions;
use kpng_sources::file::FileSource;
use kpng_store::{StoreReader, store};

const HOLD: Duration = Duration::from_millis(800);

fn services(names: &[&str]) -> String {
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            format!(
                "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\n\
                 spec: {{clusterIP: 10.96.0.{}, ports: [{{port: 80}}]}}\n",
                i + 1
            )
        })
        .collect()
}

fn count(reader: &StoreReader) -> usize {
    reader.snapshot().model().len(Kind::Service)
}

async fn start(text: &str) -> (tempfile::TempDir, std::path::PathBuf, StoreReader) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, text).unwrap();
    let source = FileSource::new(&path, true, ConvertOptions::default()).with_drop_hold(HOLD);
    let (writer, mut reader) = store(&FileSource::KINDS);
    tokio::spawn(source.run(writer));
    assert!(reader.wait_ready().await);
    (dir, path, reader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_of_most_objects_applies_only_if_it_persists() {
    let (_dir, path, reader) = start(&services(&["a", "b", "c", "d"])).await;
    assert_eq!(count(&reader), 4);
    std::fs::write(&path, services(&["a"])).unwrap();
    tokio::time::sleep(HOLD / 2).await;
    assert_eq!(count(&reader), 4, "held back");
    tokio::time::sleep(HOLD * 2).await;
    assert_eq!(count(&reader), 1, "applied once it persisted");
    let model: GlobalModel = reader.snapshot().model().clone();
    assert_eq!(&**model.services().next().unwrap().key.name(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_that_a_writer_completes_is_never_applied() {
    let (_dir, path, reader) = start(&services(&["a", "b", "c", "d"])).await;
    let revision = reader.snapshot().revision();
    std::fs::write(&path, services(&["a"])).unwrap();
    tokio::time::sleep(HOLD / 2).await;
    std::fs::write(&path, services(&["a", "b", "c", "d"])).unwrap();
    tokio::time::sleep(HOLD * 2).await;
    assert_eq!(count(&reader), 4);
    assert_eq!(reader.snapshot().revision(), revision, "no revision at all");
}
