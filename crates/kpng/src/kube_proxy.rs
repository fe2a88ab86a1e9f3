//! kpng as kube-proxy: started under the name `kube-proxy` (the image ships
//! `/usr/local/bin/kube-proxy`, the path kubeadm's DaemonSet runs) or as
//! `kpng kube-proxy ...`, kpng takes kube-proxy's command line and its
//! `KubeProxyConfiguration`, and runs the pipeline they describe:
//!
//! ```text
//! kube-proxy --config=/var/lib/kube-proxy/config.conf --hostname-override=$(NODE_NAME)
//!   => kpng kube --kubeconfig ... to-local to-iptables --node ... (and the rest)
//! ```
//!
//! The entry only translates: [`flags`] parses kube-proxy's flags, [`config`] decodes its
//! file, [`translate`] turns the configuration into kpng's own options, and what kpng
//! ignores or does differently comes back as notices, logged at start.

pub mod config;
pub mod flags;
pub mod translate;

use std::ffi::OsString;
use std::path::Path;

use translate::Notice;

/// What the kube-proxy entry asks for.
#[derive(Debug)]
pub enum Entry {
    /// Not started as kube-proxy: kpng's own command line, unchanged.
    Kpng(Vec<OsString>),
    /// Run kpng with these arguments, and say these notices once logging is up.
    Run { args: Vec<OsString>, notices: Vec<Notice> },
    /// Print this on standard output and exit 0 (`--help`, `--version`, `--write-config-to`).
    Print(String),
}

/// The program name kubeadm's DaemonSet starts.
pub const NAME: &str = "kube-proxy";

/// Whether `args` start kpng as kube-proxy: under that name, or as `kpng kube-proxy`.
fn kube_proxy_args(args: &[OsString]) -> Option<&[OsString]> {
    let program = args.first().map(Path::new).and_then(Path::file_name);
    if program.is_some_and(|p| p == NAME) {
        return Some(&args[1..]);
    }
    (args.get(1).is_some_and(|a| a == NAME)).then(|| &args[2..])
}

/// Reads the command line: kpng's own, or kube-proxy's translated into kpng's.
pub fn entry(args: Vec<OsString>) -> Result<Entry, String> {
    let Some(given) = kube_proxy_args(&args) else { return Ok(Entry::Kpng(args)) };
    let given: Vec<String> = given
        .iter()
        .map(|a| a.to_str().map(String::from).ok_or_else(|| format!("argument {a:?} is not UTF-8")))
        .collect::<Result<_, _>>()?;
    let given = flags::parse(&given)?;
    if given.is_set("help") {
        return Ok(Entry::Print(flags::help()));
    }
    if given.get("version").is_some_and(|v| v != "false") {
        return Ok(Entry::Print(format!(
            "kube-proxy (kpng {}): kube-proxy v1.33's command line\n",
            env!("CARGO_PKG_VERSION")
        )));
    }
    let mut notices = Vec::new();
    let mut kpng_config = None;
    let configuration = match given.get("config").filter(|p| !p.is_empty()) {
        None => flags::configuration(&given)?,
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("--config {path}: {e}"))?;
            if config::is_kube_proxy_configuration(&text) {
                let decoded = config::decode(&text).map_err(|e| format!("--config {path}: {e}"))?;
                if !decoded.lenient.is_empty() {
                    notices.push(Notice::Differs(format!(
                        "--config {path}: strict decoding failed ({}); decoded leniently, as kube-proxy does for v1alpha1",
                        decoded.lenient.join("; ")
                    )));
                }
                let mut c = decoded.configuration;
                flags::apply_logging(&given, c.logging.get_or_insert_with(Default::default))?;
                let overridden: Vec<String> = given
                    .0
                    .iter()
                    .filter(|(f, _)| f.scope == flags::Scope::Config)
                    .map(|(f, _)| format!("--{}", f.name))
                    .collect();
                if !overridden.is_empty() {
                    notices.push(Notice::Ignored(format!(
                        "{}: --config's file replaces these flags, as with kube-proxy",
                        overridden.join(", ")
                    )));
                }
                c
            } else {
                // kpng's own config file, under the kube-proxy entry.
                kpng_config = Some(path.to_string());
                flags::configuration(&given)?
            }
        }
    };
    let ignored: Vec<String> = given
        .0
        .iter()
        .filter(|(f, _)| f.scope == flags::Scope::Ignored)
        .map(|(f, _)| format!("--{}", f.name))
        .collect();
    if !ignored.is_empty() {
        notices
            .push(Notice::Ignored(format!("{}: kpng logs on standard error", ignored.join(", "))));
    }
    if let Some(path) = given.get("write-config-to").filter(|p| !p.is_empty()) {
        let text = serde_saphyr::to_string(&config::defaulted(&configuration))
            .map_err(|e| format!("--write-config-to {path}: {e}"))?;
        std::fs::write(path, text).map_err(|e| format!("--write-config-to {path}: {e}"))?;
        return Ok(Entry::Print(String::new()));
    }
    if given.is_set("cleanup") {
        // Both kube-proxy's and kpng's rules, whatever the mode.
        let args = [&args[0], &"cleanup".into(), &"--kube-proxy".into()];
        return Ok(Entry::Run { args: args.into_iter().cloned().collect(), notices });
    }
    let node = node_name(given.get("hostname-override"), &configuration)?;
    let mut kpng = translate::kpng_args(&configuration, &node, given.get("master"), &mut notices)?;
    // kube-proxy no longer runs: its rules go.
    kpng.push("--remove-kube-proxy".into());
    if given.is_set("init-only") {
        kpng.push("--init-only".into());
    }
    if let Some(path) = kpng_config {
        kpng.extend(["--config".into(), path]);
    }
    if let Some(path) = given.get("config").filter(|p| !p.is_empty()) {
        kpng.extend(["--exit-on-change".into(), path.to_string()]);
    }
    let mut out: Vec<OsString> = vec![args[0].clone()];
    out.extend(kpng.into_iter().map(OsString::from));
    Ok(Entry::Run { args: out, notices })
}

/// The node's name: `--hostname-override`, else the file's `hostnameOverride`, else the
/// hostname; trimmed and in lower case, as kube-proxy has it.
fn node_name(flag: Option<&str>, c: &config::Configuration) -> Result<String, String> {
    if let Some(name) = flag.filter(|n| !n.is_empty()) {
        let name = name.trim();
        if name.is_empty() {
            return Err("--hostname-override: empty hostname-override is invalid".into());
        }
        return Ok(name.to_lowercase());
    }
    if let Some(name) = c.hostname_override.as_deref().map(str::trim).filter(|n| !n.is_empty()) {
        return Ok(name.to_lowercase());
    }
    Ok(gethostname::gethostname().to_string_lossy().trim().to_lowercase())
}

#[cfg(test)]
mod tests;
