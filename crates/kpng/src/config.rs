//! The config file (`--config PATH`, YAML): the process-wide options, keyed by their flag
//! names. Flags on the command line win over the file; the file wins over the
//! environment and the defaults.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::cli::{GlobalOption, global_options};

/// Process-wide options that describe one invocation, not a node's configuration.
const NOT_KEYS: &[&str] = &["config", "once", "once-timeout", "dry-run", "stats"];

/// The options a config file may set: every process-wide option but [`NOT_KEYS`].
fn keys() -> Vec<GlobalOption> {
    global_options().into_iter().filter(|o| !NOT_KEYS.contains(&o.name.as_str())).collect()
}

/// A value in the file: a scalar, or a list for list options.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Value {
    Switch(bool),
    Integer(i64),
    Number(f64),
    Text(String),
    List(Vec<Value>),
}

impl Value {
    fn text(&self) -> Option<String> {
        match self {
            Value::Switch(b) => Some(b.to_string()),
            Value::Integer(i) => Some(i.to_string()),
            Value::Number(n) => Some(n.to_string()),
            Value::Text(t) => Some(t.clone()),
            Value::List(_) => None,
        }
    }
}

/// The flag arguments that set `option` to `value`.
fn flag_args(option: &GlobalOption, value: &Value) -> Result<Vec<String>, String> {
    let flag = format!("--{}", option.name);
    if !option.takes_value {
        return match value {
            Value::Switch(true) => Ok(vec![flag]),
            Value::Switch(false) => Ok(Vec::new()),
            _ => Err("expected true or false".into()),
        };
    }
    let text = match value {
        Value::List(items) if option.list => {
            let items: Option<Vec<String>> = items.iter().map(Value::text).collect();
            items.ok_or("expected a list of values")?.join(",")
        }
        Value::List(_) => return Err("expected one value, not a list".into()),
        scalar => scalar.text().unwrap_or_default(),
    };
    if option.list && text.is_empty() {
        return Ok(Vec::new());
    }
    Ok(vec![flag, text])
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
    let file: BTreeMap<String, Value> = if text.trim().is_empty() {
        BTreeMap::new()
    } else {
        serde_saphyr::from_str(&text)
            .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?
    };
    let keys = keys();
    let mut injected: Vec<OsString> = Vec::new();
    for (key, value) in &file {
        let Some(option) = keys.iter().find(|o| &o.name == key) else {
            bail!(
                "config file {}: unknown key `{key}`; `kpng config print-defaults` lists them",
                path.display()
            );
        };
        if given(&args, key) {
            continue;
        }
        let flag_args = flag_args(option, value)
            .map_err(|e| anyhow::anyhow!("config file {}: key `{key}`: {e}", path.display()))?;
        if let Err(e) = crate::cli::global_args_from(&flag_args) {
            bail!("config file {}: key `{key}`: {e}", path.display());
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

/// `text` as `# ` comment lines of at most 90 columns.
fn comment(text: &str) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 90 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// A complete config file with every key at its built-in default (not the environment's),
/// each explained.
pub fn print_defaults() -> String {
    let mut out = String::from(
        "# kpng configuration: the process-wide options, keyed by flag name.\n\
         # Flags on the command line win over this file; this file wins over the\n\
         # environment. Use with: kpng --config PATH <source> ...\n",
    );
    for option in keys() {
        let GlobalOption { name, help, value_name, .. } = &option;
        let value = match (&option.default, option.takes_value, option.list) {
            (_, false, _) => "false".to_string(),
            (None, _, true) => "[]".to_string(),
            (Some(value), _, _) if value.contains(':') => format!("\"{value}\""),
            (Some(value), _, _) => value.clone(),
            // Without a default (the node: usually $NODE_NAME from the downward API).
            (None, _, false) => {
                out.push_str(&format!("\n{}# {name}: {value_name}\n", comment(help)));
                continue;
            }
        };
        out.push_str(&format!("\n{}{name}: {value}\n", comment(help)));
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
        let mut injected = out[1..4].to_vec();
        injected.sort();
        assert_eq!(injected, ["--masquerade-all", "--min-sync-period", "5s"]);
        assert_eq!(out.iter().filter(|a| *a == "--sync-period").count(), 1);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let error = with_config("min-sync-priod: 5s\n", &["file"]).unwrap_err().to_string();
        assert!(error.contains("min-sync-priod"), "{error}");
        let error = with_config("sync-period: soon\n", &["file"]).unwrap_err().to_string();
        assert!(error.contains("key `sync-period`") && error.contains("soon"), "{error}");
        assert!(!error.contains("error:"), "{error}");
        let error = with_config("masquerade-all: 3\n", &["file"]).unwrap_err().to_string();
        assert!(error.contains("key `masquerade-all`: expected true or false"), "{error}");
        // Invocation switches are not configuration.
        let error = with_config("once: true\n", &["file"]).unwrap_err().to_string();
        assert!(error.contains("unknown key `once`"), "{error}");
    }

    #[test]
    fn every_process_wide_option_is_a_key() {
        let out = with_config(
            "cluster-cidr: [10.0.0.0/16, fd00::/48]\nconntrack-min: 1000\n\
             conntrack-tcp-be-liberal: true\ndetect-local-mode: InterfaceNamePrefix\n\
             pod-interface-name-prefix: veth\nlogging-format: json\n",
            &["file"],
        )
        .unwrap();
        let parsed = crate::cli::global_args_from(&out[1..out.len() - 3]).unwrap();
        assert_eq!(parsed.proxy.cluster_cidr.len(), 2);
        assert_eq!(parsed.conntrack.conntrack_min, 1000);
        assert!(parsed.conntrack.conntrack_tcp_be_liberal);
        assert_eq!(parsed.logging.logging_format, crate::cli::LogFormat::Json);
        parsed.validate().unwrap();
    }

    #[test]
    fn the_printed_defaults_are_a_valid_file_of_defaults() {
        let text = print_defaults();
        for option in keys() {
            let line = match option.default.is_some() || !option.takes_value || option.list {
                true => format!("\n{}: ", option.name),
                false => format!("\n# {}: ", option.name),
            };
            assert!(text.contains(&line), "{} missing:\n{text}", option.name);
        }
        assert!(text.lines().all(|l| l.len() <= 100), "{text}");
        let out = with_config(&text, &["file"]).unwrap();
        let defaults = crate::cli::GlobalArgs::default_values();
        // [kpng, injected..., --config, PATH, file]
        let parsed = crate::cli::global_args_from(&out[1..out.len() - 3]).unwrap();
        assert_eq!(format!("{parsed:?}"), format!("{defaults:?}"));
    }
}
