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

/// The endpoint IPs set by a change set.
fn endpoints_set(change: &[serde_json::Value]) -> Vec<String> {
    let set = change.iter().filter(|op| op["op"] == "set");
    let ips = set.filter_map(|op| op["endpoint"]["endpoint"]["ip"].as_str());
    ips.map(str::to_string).collect()
}

#[test]
fn the_path_is_followed_through_symlinks_and_replaced_directories() {
    let base = tempfile::tempdir().unwrap();
    let (links, data, other) =
        (base.path().join("links"), base.path().join("data"), base.path().join("other"));
    for dir in [&links, &data, &other] {
        std::fs::create_dir(dir).unwrap();
    }
    let original = std::fs::read_to_string(example()).unwrap();
    assert!(original.contains("10.244.0.5"));
    std::fs::write(data.join("cluster.yaml"), &original).unwrap();
    // links/cluster.yaml -> ../data/cluster.yaml: only the link is in the input's directory.
    let input = links.join("cluster.yaml");
    std::os::unix::fs::symlink("../data/cluster.yaml", &input).unwrap();
    let mut kpng = watching(&input);

    // An edit of the target, in the target's directory.
    support::replace_file(
        &data.join("cluster.yaml"),
        &original.replace("10.244.0.5", "10.244.0.6"),
    );
    assert_eq!(endpoints_set(&kpng.next_change_set()), ["10.244.0.6"]);

    // The target's directory removed, then created again with another content.
    std::fs::remove_dir_all(&data).unwrap();
    nothing_changed(&kpng, "a missing input");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("cluster.yaml"), original.replace("10.244.0.5", "10.244.0.7"))
        .unwrap();
    assert_eq!(endpoints_set(&kpng.next_change_set()), ["10.244.0.7"]);

    // The link repointed into a third directory, then that file edited.
    std::fs::write(other.join("cluster.yaml"), original.replace("10.244.0.5", "10.244.0.8"))
        .unwrap();
    let repointed = links.join("cluster.yaml.new");
    std::os::unix::fs::symlink("../other/cluster.yaml", &repointed).unwrap();
    std::fs::rename(&repointed, &input).unwrap();
    assert_eq!(endpoints_set(&kpng.next_change_set()), ["10.244.0.8"]);
    support::replace_file(
        &other.join("cluster.yaml"),
        &original.replace("10.244.0.5", "10.244.0.9"),
    );
    assert_eq!(endpoints_set(&kpng.next_change_set()), ["10.244.0.9"]);
    // The directory the link used to point into no longer matters.
    std::fs::write(data.join("cluster.yaml"), original.replace("10.244.0.5", "10.244.0.10"))
        .unwrap();
    nothing_changed(&kpng, "an edit of the file the link no longer names");
}
