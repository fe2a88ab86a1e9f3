//! Files given by flags are the operator's: kpng reads what they say as the truth (the
//! manifests, the config, a kubeconfig, nftlb's key, TLS keys). One that a user other than
//! root could change, or that lies in a directory another user could write, is warned
//! about: whoever writes it controls what kpng enforces.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use kpng_api::peer::{check_directories_above, own_uid};

/// Logs a warning when `path` (given by `flag`) can be changed by someone other than root
/// and kpng's own user. A file that cannot be read is left to the reader's own error.
pub fn warn_if_shared(path: &Path, flag: &str) {
    if let Some(why) = shared(path) {
        tracing::warn!(
            path = %path.display(),
            "{flag}: {why}: whoever can write it controls what kpng enforces"
        );
    }
}

/// Why others could change `path`, if they could.
fn shared(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    let (owner, mode) = (meta.uid(), meta.mode() & 0o7777);
    if owner != 0 && owner != own_uid() {
        return Some(format!("the file belongs to uid {owner}"));
    }
    if mode & 0o022 != 0 {
        return Some(format!("the file is writable by group or others (mode {mode:04o})"));
    }
    check_directories_above(path).err().map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn files_others_can_change_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.yaml");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(shared(&path), None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(shared(&path).unwrap().contains("mode 0666"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(shared(&path).unwrap().contains("0777"), "its directory");
        assert_eq!(shared(&dir.path().join("missing")), None, "left to the reader");
    }
}
