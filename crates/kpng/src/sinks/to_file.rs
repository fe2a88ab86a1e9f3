//! `to-file`: the global model, dumped on every revision.

use std::path::Path;

use anyhow::Context;
use kpng_model::global::ModelDocument;
use kpng_store::StoreReader;

use crate::cli::{FileFormat, ToFileArgs};

/// Writes the model to `args.output` at every new revision (once with `once`).
pub async fn run_to_file(
    mut reader: StoreReader,
    args: ToFileArgs,
    once: bool,
) -> anyhow::Result<()> {
    let mut seen = None;
    while reader.wait_after(seen).await.is_some() {
        let (document, revision) = {
            let snapshot = reader.snapshot();
            (ModelDocument::from(snapshot.model()), snapshot.revision())
        };
        seen = Some(revision);
        let text = match args.format {
            FileFormat::Yaml => {
                serde_saphyr::to_string(&document).context("encoding the model as YAML")?
            }
            FileFormat::Json => {
                serde_json::to_string_pretty(&document).context("encoding the model as JSON")?
                    + "\n"
            }
        };
        write_atomically(&args.output, text.as_bytes())?;
        tracing::info!(revision, path = %args.output.display(), "model written");
        if once {
            break;
        }
    }
    Ok(())
}

/// Writes `bytes` to a temporary file beside `path`, then renames it over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name =
        path.file_name().with_context(|| format!("{} is not a file path", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
