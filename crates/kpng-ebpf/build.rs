//! Compiles the BPF programs (`bpf/kpng_sock.c`) with clang against libbpf's headers.
//!
//! Without clang (or without the headers) everything else still builds: the object is then
//! empty and `reason.txt` says why, which `to-ebpf` reports at start. `KPNG_EBPF_CLANG`
//! names another clang; `KPNG_EBPF_REQUIRE=1` makes a missing toolchain a build error
//! (CI sets it, so a broken set-up cannot pass as "unavailable").

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = "bpf/kpng_sock.c";

fn main() {
    println!("cargo::rerun-if-changed={SOURCE}");
    println!("cargo::rerun-if-env-changed=KPNG_EBPF_CLANG");
    println!("cargo::rerun-if-env-changed=KPNG_EBPF_REQUIRE");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out.join("kpng_sock.o");
    let reason = match compile(&object) {
        Ok(()) => String::new(),
        Err(reason) => {
            if std::env::var("KPNG_EBPF_REQUIRE").is_ok_and(|v| v == "1") {
                panic!("KPNG_EBPF_REQUIRE=1 but the BPF programs cannot be built: {reason}");
            }
            println!("cargo::warning=to-ebpf will be unavailable: {reason}");
            std::fs::write(&object, []).expect("writing the empty object");
            reason
        }
    };
    std::fs::write(out.join("reason.txt"), reason).expect("writing reason.txt");
}

fn compile(object: &Path) -> Result<(), String> {
    let clang = std::env::var("KPNG_EBPF_CLANG").unwrap_or_else(|_| "clang".into());
    if Command::new(&clang).arg("--version").output().is_err() {
        return Err(format!(
            "`{clang}` was not found when kpng was built (install clang, llvm and libbpf-dev, then rebuild)"
        ));
    }
    let headers = ["/usr/include/bpf/bpf_helpers.h", "/usr/local/include/bpf/bpf_helpers.h"];
    if !headers.iter().any(|h| Path::new(h).exists()) {
        return Err("libbpf's headers (bpf/bpf_helpers.h) were not found when kpng was built (install libbpf-dev, then rebuild)".into());
    }
    // <linux/bpf.h> includes <asm/types.h>, which Debian keeps under the multiarch triple.
    let multiarch = Command::new("gcc")
        .arg("-dumpmachine")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| {
            format!("{}-linux-gnu", std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default())
        });
    let output = Command::new(&clang)
        .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
        .arg(format!("-I/usr/include/{multiarch}"))
        // Paths in the debug info do not depend on where the tree is.
        .arg(format!(
            "-fdebug-prefix-map={}=.",
            std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()
        ))
        .args(["-c", SOURCE, "-o"])
        .arg(object)
        .output()
        .map_err(|e| format!("running {clang}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{clang} failed on {SOURCE}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(())
}
