//! The config file (`--config PATH`, YAML): the process-wide options, keyed by their flag
//! names. Flags on the command line win over the file; the file wins over the
//! environment and the defaults.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;

/// The keys a config file may set, each with its flag's meaning.
const KEYS: &[(&str, &str)] = &[
    ("node", "The node whose state to-local computes (default: $NODE_NAME, then the hostname)."),
    ("log", "Log filter for standard error, in RUST_LOG syntax."),
    ("cluster-cidr", "The cluster's pod CIDRs, one per family (default: the node's podCIDRs)."),
    ("masquerade-all", "Masquerade (SNAT) all traffic to cluster IPs."),
    ("nodeport-addresses", "Where NodePorts are accepted: primary, or CIDRs."),
    ("masquerade-bit", "The packet-mark bit that flags connections for masquerading (0-31)."),
    ("healthz-bind-address", "Where /healthz, /livez and /readyz are served (port 0: not)."),
    ("metrics-bind-address", "Where /metrics and /state are served (port 0: not)."),
    ("min-sync-period", "Least time between two change sets, after a burst of two (0: none)."),
    ("sync-period", "Verify the kernel's rules this often (0: never); twice this fails health."),
];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ConfigFile {
    node: Option<String>,
    log: Option<String>,
    cluster_cidr: Option<Vec<String>>,
    masquerade_all: Option<bool>,
    nodeport_addresses: Option<String>,
    masquerade_bit: Option<u8>,
    healthz_bind_address: Option<String>,
    metrics_bind_address: Option<String>,
    min_sync_period: Option<String>,
    sync_period: Option<String>,
}

impl ConfigFile {
    /// `(key, flag arguments)` for every key the file sets.
    fn settings(&self) -> Vec<(&'static str, Vec<String>)> {
        let mut out = Vec::new();
        let mut value = |key: &'static str, v: &Option<String>| {
            if let Some(v) = v {
                out.push((key, vec![format!("--{key}"), v.clone()]));
            }
        };
        value("node", &self.node);
        value("log", &self.log);
        value("nodeport-addresses", &self.nodeport_addresses);
        value("healthz-bind-address", &self.healthz_bind_address);
        value("metrics-bind-address", &self.metrics_bind_address);
        value("min-sync-period", &self.min_sync_period);
        value("sync-period", &self.sync_period);
        if let Some(cidrs) = self.cluster_cidr.as_ref().filter(|c| !c.is_empty()) {
            out.push(("cluster-cidr", vec!["--cluster-cidr".into(), cidrs.join(",")]));
        }
        if self.masquerade_all == Some(true) {
            out.push(("masquerade-all", vec!["--masquerade-all".into()]));
        }
        if let Some(bit) = self.masquerade_bit {
            out.push(("masquerade-bit", vec!["--masquerade-bit".into(), bit.to_string()]));
        }
        out
    }
}

/// The path given with `--config PATH` or `--config=PATH`, if any.
fn config_path(args: &[OsString]) -> Option<OsString> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy();
        if text == "--config" {
            return iter.next().cloned();
        }
        if let Some(path) = text.strip_prefix("--config=") {
            return Some(path.into());
        }
    }
    None
}

/// Whether the command line sets `--key` itself.
fn given(args: &[OsString], key: &str) -> bool {
    let flag = format!("--{key}");
    args.iter().any(|a| {
        let a = a.to_string_lossy();
        a == flag || a.starts_with(&format!("{flag}="))
    })
}

/// The command line with the config file's settings added for every option the command
/// line does not set. Each setting is checked like its flag; an error names the file and
/// the key.
pub fn expand_args(args: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let Some(path) = config_path(&args) else { return Ok(args) };
    let path = Path::new(&path);
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the config file {}", path.display()))?;
    let file: ConfigFile = if text.trim().is_empty() {
        ConfigFile::default()
    } else {
        serde_saphyr::from_str(&text)
            .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?
    };
    let mut injected: Vec<OsString> = Vec::new();
    for (key, flag_args) in file.settings() {
        if given(&args, key) {
            continue;
        }
        if let Err(e) = crate::cli::check_global_args(&flag_args) {
            bail!("config file {}: key `{key}`: {}", path.display(), e.trim_end());
        }
        injected.extend(flag_args.into_iter().map(OsString::from));
    }
    // Right after the program name: process-wide options are accepted anywhere.
    let mut out = Vec::with_capacity(args.len() + injected.len());
    let mut args = args.into_iter();
    out.extend(args.next());
    out.extend(injected);
    out.extend(args);
    Ok(out)
}

/// A complete config file with every key at its built-in default (not the environment's),
/// each explained.
pub fn print_defaults() -> String {
    let mut out = String::from(
        "# kpng configuration: the process-wide options, keyed by flag name.\n\
         # Flags on the command line win over this file; this file wins over the\n\
         # environment. Use with: kpng --config PATH <source> ...\n",
    );
    for (key, help) in KEYS {
        let value = match (*key, crate::cli::builtin_default(key)) {
            // Per node: usually $NODE_NAME from the downward API, not a shared file.
            ("node", _) => {
                out.push_str(&format!("\n# {help}\n# node: NAME\n"));
                continue;
            }
            ("cluster-cidr", _) => "[]".to_string(),
            ("masquerade-all", _) => "false".to_string(),
            (_, Some(value)) if value.contains(':') => format!("\"{value}\""),
            (_, Some(value)) => value,
            (other, None) => unreachable!("no default for {other}"),
        };
        out.push_str(&format!("\n# {help}\n{key}: {value}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    fn with_config(text: &str, list: &[&str]) -> anyhow::Result<Vec<String>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kpng.yaml");
        std::fs::write(&path, text).unwrap();
        let mut all = vec!["kpng", "--config", path.to_str().unwrap()];
        all.extend(list);
        Ok(expand_args(args(&all))?.iter().map(|a| a.to_string_lossy().into_owned()).collect())
    }

    #[test]
    fn flags_win_over_the_file() {
        let out = with_config(
            "min-sync-period: 5s\nsync-period: 1m\nmasquerade-all: true\n",
            &["file", "--input", "x", "to-local", "to-json", "--sync-period", "10s"],
        )
        .unwrap();
        assert_eq!(out[1..4], ["--min-sync-period", "5s", "--masquerade-all"]);
        assert_eq!(out.iter().filter(|a| *a == "--sync-period").count(), 1);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let error = with_config("min-sync-priod: 5s\n", &["file"]).unwrap_err().to_string();
        assert!(error.contains("min-sync-priod"), "{error}");
        let error = with_config("sync-period: soon\n", &["file"]).unwrap_err().to_string();
        assert!(error.contains("key `sync-period`") && error.contains("soon"), "{error}");
    }

    #[test]
    fn the_printed_defaults_are_a_valid_file_of_defaults() {
        let text = print_defaults();
        for (key, _) in KEYS.iter().filter(|(k, _)| *k != "node") {
            assert!(text.contains(&format!("\n{key}: ")), "{key} missing:\n{text}");
        }
        let file: ConfigFile = serde_saphyr::from_str(&text).unwrap();
        for (_, flag_args) in file.settings() {
            crate::cli::check_global_args(&flag_args).unwrap();
        }
        let out = with_config(&text, &["file"]).unwrap();
        let defaults = crate::cli::GlobalArgs::default_values();
        // [kpng, injected..., --config, PATH, file]
        let parsed = crate::cli::global_args_from(&out[1..out.len() - 3]).unwrap();
        assert_eq!(format!("{parsed:?}"), format!("{defaults:?}"));
    }
}
