//! Which identity owns each producer name, kept in a file so that a restart of the
//! aggregator changes nothing: the first identity to publish a name (a Unix user, `uid:0`, or
//! a certificate's names, `cert:DNS:...`) holds it for good, and another identity is refused
//! that name even after the owner's lease ran out and its tables are gone.
//!
//! The file is JSON (`{"kpng": "uid:0", "fw": "cert:DNS:fw.example"}`), written whole
//! through a temporary file and a rename, mode 0600, in a directory nobody else can write
//! ([`kpng_api::peer::check_directories_above`], as for a socket). To hand a name to another
//! identity, remove its entry while the aggregator is stopped.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Producer name to the identity that owns it ([`kpng_api::peer::PeerIdentity::key`]).
pub type Bindings = BTreeMap<String, String>;

/// Why the bindings file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("producer bindings {}: {message}", path.display())]
pub struct BindingsError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

/// Reads the bindings at `path`: none when the file does not exist yet. A file that cannot
/// be read or parsed, or lies where another user could replace it, is an error: names would
/// otherwise be free for anyone to take.
pub fn load(path: &Path) -> Result<Bindings, BindingsError> {
    let error = |message: String| BindingsError { path: path.to_path_buf(), message };
    kpng_api::peer::check_directories_above(path).map_err(|e| error(e.to_string()))?;
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Bindings::new()),
        Err(e) => return Err(error(e.to_string())),
    };
    serde_json::from_str(&text).map_err(|e| error(format!("not a JSON object of names: {e}")))
}

/// Writes `bindings` to `path` whole (its directory is created, mode 0755, if missing).
pub fn save(path: &Path, bindings: &Bindings) -> Result<(), BindingsError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let error = |message: String| BindingsError { path: path.to_path_buf(), message };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| error(format!("creating {}: {e}", dir.display())))?;
    }
    kpng_api::peer::check_directories_above(path).map_err(|e| error(e.to_string()))?;
    let text = serde_json::to_string_pretty(bindings).map_err(|e| error(e.to_string()))?;
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.write_all(b"\n")?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error(e.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn bindings_survive_a_save_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/producers.json");
        assert!(load(&path).unwrap().is_empty(), "no file yet: no bindings");
        let bindings: Bindings = [("kpng", "uid:0"), ("fw", "cert:DNS:fw.example")]
            .map(|(name, owner)| (name.to_string(), owner.to_string()))
            .into();
        save(&path, &bindings).unwrap();
        assert_eq!(load(&path).unwrap(), bindings);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["producers.json"], "nothing left beside it");
    }

    #[test]
    fn a_bad_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("producers.json");
        std::fs::write(&path, "[1, 2]").unwrap();
        let error = load(&path).unwrap_err().to_string();
        assert!(error.contains("producers.json") && error.contains("JSON"), "{error}");
        // In a directory others can write, it is refused whatever it holds.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = load(&open.join("producers.json")).unwrap_err().to_string();
        assert!(error.contains("0777"), "{error}");
        assert!(save(&open.join("producers.json"), &Bindings::new()).is_err());
    }
}
