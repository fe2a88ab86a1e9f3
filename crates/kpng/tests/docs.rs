//! The documentation against the binary: every kpng (or kube-proxy) command a page shows
//! in a shell block names options its command accepts (they appear in that command's
//! `--help`), and every page is reachable from the README.

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::binary;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The lines of a page's shell blocks (```sh), continuation lines joined.
fn shell_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            inside = trimmed == "```sh" || trimmed == "```bash";
            continue;
        }
        if !inside || trimmed.starts_with('#') {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(trimmed);
                out.push(std::mem::take(&mut pending));
            }
        }
    }
    out
}

const SUBCOMMANDS: &[&str] = &[
    "file",
    "kube",
    "api",
    "local",
    "cleanup",
    "aggregate",
    "publish",
    "version",
    "config",
    "print-defaults",
    "to-file",
    "to-local",
    "to-api",
    "to-nft",
    "to-iptables",
    "to-ebpf",
    "to-nftlb",
    "to-json",
    "kube-proxy",
];

/// The words after the program of each kpng invocation on `line`: `kpng ...`,
/// `.../kpng ...`, `cargo run ... -- ...`, or `kube-proxy ...` (as `kube-proxy ...`).
fn invocation(line: &str) -> Option<Vec<String>> {
    let words: Vec<&str> = line.split_whitespace().collect();
    for (i, word) in words.iter().enumerate() {
        let name = word.rsplit('/').next().unwrap_or(word);
        if name == "kpng" {
            return Some(words[i + 1..].iter().map(|w| w.to_string()).collect());
        }
        if name == "kube-proxy" && i == 0 {
            let mut args = vec!["kube-proxy".to_string()];
            args.extend(words[1..].iter().map(|w| w.to_string()));
            return Some(args);
        }
        if *word == "cargo" && words.get(i + 1) == Some(&"run") {
            let dashes = words.iter().position(|w| *w == "--")?;
            // Another package's binary (`-p kpng-testkit --bin kpng-dev`) is not kpng.
            let other = words[..dashes]
                .windows(2)
                .any(|pair| matches!(pair[0], "-p" | "--package" | "--bin") && pair[1] != "kpng");
            if other {
                return None;
            }
            return Some(words[dashes + 1..].iter().map(|w| w.to_string()).collect());
        }
    }
    None
}

#[test]
fn every_option_a_page_shows_is_in_its_commands_help() {
    let mut helps: HashMap<Vec<String>, String> = HashMap::new();
    let mut help = |path: &[String]| -> String {
        helps
            .entry(path.to_vec())
            .or_insert_with(|| {
                let out = Command::new(binary()).args(path).arg("--help").output().unwrap();
                assert!(out.status.success(), "kpng {path:?} --help failed");
                String::from_utf8_lossy(&out.stdout).into_owned()
            })
            .clone()
    };
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(root()).unwrap_or(&page).display().to_string();
        for line in shell_lines(&text) {
            let Some(words) = invocation(&line) else { continue };
            let mut path: Vec<String> = Vec::new();
            for word in &words {
                // Shell syntax ends the command.
                if ["|", "&&", ";", ">", "2>", "&"].contains(&word.as_str()) {
                    break;
                }
                if SUBCOMMANDS.contains(&word.as_str()) && !path.contains(word) {
                    path.push(word.clone());
                    continue;
                }
                let Some(flag) = word.strip_prefix("--") else { continue };
                let flag = flag.split('=').next().unwrap_or(flag);
                let shown = help(&path);
                assert!(
                    shown.contains(&format!("--{flag}")),
                    "{name}: `{line}`: --{flag} is not an option of `kpng {}`",
                    path.join(" ")
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 30, "only {checked} options found in the pages' commands");
}

#[test]
fn every_page_is_reachable_from_the_readme() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for page in pages().into_iter().skip(1) {
        let relative = page.strip_prefix(root()).unwrap().display().to_string();
        assert!(readme.contains(&format!("]({relative}")), "README.md does not link {relative}");
    }
}
