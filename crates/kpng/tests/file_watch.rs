//! `kpng file --watch` never applies a half-written file: writes in progress, emptied
//! files and sudden drops keep the state in force; an explicit empty List removes all.

#[path = "support/mod.rs"]
mod support;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use support::{Kpng, example};

/// Longer than the file source's settling time and a read.
const SETTLED: Duration = Duration::from_millis(1500);

fn watching(path: &Path) -> Kpng {
    let path = path.to_str().unwrap();
    let args = ["file", "--input", path, "--watch", "to-local", "--node", "node-a", "to-json"];
    let mut kpng = Kpng::spawn(&args);
    let first = kpng.next_change_set();
    assert_eq!(first.first().unwrap()["op"], "reset");
    kpng
}

/// No op came out.
fn nothing_changed(kpng: &Kpng, after: &str) {
    std::thread::sleep(SETTLED);
    assert_eq!(kpng.try_line(), None, "{after} changed the state; stderr:\n{}", kpng.stderr());
}

#[test]
fn a_file_written_slowly_or_emptied_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    let original = std::fs::read_to_string(example()).unwrap();
    std::fs::write(&path, &original).unwrap();
    let kpng = watching(&path);

    // `(sleep 0.5; cat cluster.yaml) > file`: the shell empties the file at once, the
    // content comes half a second later.
    let mut file = std::fs::File::create(&path).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    file.write_all(original.as_bytes()).unwrap();
    drop(file);
    nothing_changed(&kpng, "a slow rewrite");
    assert!(kpng.stderr().contains("holds no document"), "{}", kpng.stderr());

    // `: > file`: emptied for good.
    std::fs::File::create(&path).unwrap();
    nothing_changed(&kpng, "an emptied file");

    // Cut short in the middle of a document, then in the middle of a line.
    let cut = original.find("name: checkout").unwrap();
    std::fs::write(&path, &original[..cut]).unwrap();
    nothing_changed(&kpng, "a file cut short");
    std::fs::write(&path, &original[..cut + 8]).unwrap();
    nothing_changed(&kpng, "a file cut mid-line");
    let stderr = kpng.stderr();
    assert!(stderr.contains("middle of a line") && stderr.contains("invalid"), "{stderr}");

    // The whole file again: the state in force already is the file's.
    std::fs::write(&path, &original).unwrap();
    nothing_changed(&kpng, "the original content");
}

#[test]
fn an_explicit_empty_list_removes_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::copy(example(), &path).unwrap();
    let mut kpng = watching(&path);
    support::replace_file(&path, "apiVersion: v1\nkind: List\nitems: []\n");
    let change = kpng.next_change_set();
    let deletes = change.iter().filter(|op| op["op"] == "delete").count();
    assert!(deletes > 5, "every service and endpoint goes: {change:?}");
}

#[test]
fn an_unreadable_file_is_reported_once_not_at_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::copy(example(), &path).unwrap();
    let kpng = watching(&path);
    std::fs::remove_file(&path).unwrap();
    // Other files of the directory keep changing.
    for i in 0..20 {
        std::fs::write(dir.path().join("other"), format!("{i}")).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    nothing_changed(&kpng, "a deleted file");
    let warnings = kpng.stderr().matches("cannot read manifests").count();
    assert_eq!(warnings, 1, "{}", kpng.stderr());
}
