//! [`Manifest`]: `manifest.json` of a tag directory, written last, before the tag is renamed
//! into place: the tag, its step, and every other file of the tag with its size and CRC-32.
//!
//! On load every file is read once, its digest compared with the manifest's
//! ([`Manifest::verified_bytes`]), so a flipped byte, a truncated file or a file copied in from
//! another tag is refused with the file's name and both digests; a file the loader needs but
//! the manifest does not list is refused too. CRC-32 (IEEE) detects every single-bit and
//! every burst error up to 32 bits, which is what disks and careless copies do; it is not a
//! defence against someone forging a checkpoint.

use dsplan_planner::user_file::{self, FileKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::CheckpointError;
use super::layout::tag_of_step;
use super::state::FORMAT;

/// The manifest's file name inside a tag directory.
pub const MANIFEST: &str = "manifest.json";

/// One file of a tag, as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// Its size in bytes.
    pub bytes: u64,
    /// CRC-32 (IEEE) of its bytes, 8 hex digits.
    pub crc32: String,
}

/// The contents of `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The checkpoint format ([`FORMAT`]).
    pub format: String,
    /// The tag (`global_step{N}`).
    pub tag: String,
    /// The step the tag was taken after (N).
    pub global_step: u64,
    /// Every other file of the tag directory, by name.
    pub files: BTreeMap<String, FileDigest>,
}

/// CRC-32 (IEEE) of `bytes`, as 8 hex digits.
pub fn file_digest(bytes: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(bytes))
}

impl Manifest {
    /// The manifest of the files now in `staging` (a tag being saved after `global_step`
    /// steps), each read back and digested.
    pub fn of_directory(staging: &Path, global_step: u64) -> Result<Self, CheckpointError> {
        let mut files = BTreeMap::new();
        let entries = std::fs::read_dir(staging).map_err(|e| CheckpointError::io(staging, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| CheckpointError::io(staging, &e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == MANIFEST {
                continue;
            }
            let path = entry.path();
            let bytes = std::fs::read(&path).map_err(|e| CheckpointError::io(&path, &e))?;
            files.insert(
                name,
                FileDigest {
                    bytes: bytes.len() as u64,
                    crc32: file_digest(&bytes),
                },
            );
        }
        Ok(Self {
            format: FORMAT.to_string(),
            tag: tag_of_step(global_step),
            global_step,
            files,
        })
    }

    /// Reads `tag_dir/manifest.json` and checks it names the tag `tag`.
    pub fn read(tag_dir: &Path, tag: &str) -> Result<Self, CheckpointError> {
        let path = tag_dir.join(MANIFEST);
        if !user_file::exists(&path) {
            return Err(CheckpointError::Missing {
                path,
                what: "manifest.json (every checkpoint this dsplan writes has one; the tag is \
                       incomplete or was written by an older dsplan)",
            });
        }
        let bytes = user_file::read(&path, FileKind::CheckpointJson)
            .map_err(|e| CheckpointError::io(&path, &e))?;
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| CheckpointError::corrupt(&path, "(document)", e.to_string()))?;
        if manifest.format != FORMAT {
            return Err(CheckpointError::corrupt(
                &path,
                "format",
                format!("`{}`, this dsplan reads `{FORMAT}`", manifest.format),
            ));
        }
        if manifest.tag != tag_of_step(manifest.global_step) {
            return Err(CheckpointError::corrupt(
                &path,
                "tag",
                format!(
                    "`{}` is not the tag of its global_step {}",
                    manifest.tag, manifest.global_step
                ),
            ));
        }
        // A tag directory passed by path may have been renamed; `latest` names the real one.
        if manifest.tag != tag && tag.starts_with("global_step") {
            return Err(CheckpointError::corrupt(
                &path,
                "tag",
                format!(
                    "`{}`, but it lies in the tag directory `{tag}` (copied from another tag?)",
                    manifest.tag
                ),
            ));
        }
        Ok(manifest)
    }

    /// Writes the manifest into `staging`, synced; returns its size.
    pub fn write(&self, staging: &Path) -> Result<u64, CheckpointError> {
        use std::io::Write;
        let path = staging.join(MANIFEST);
        let json = serde_json::to_vec_pretty(self)
            .map_err(|e| CheckpointError::corrupt(&path, "(document)", e.to_string()))?;
        let mut file = std::fs::File::create(&path).map_err(|e| CheckpointError::io(&path, &e))?;
        file.write_all(&json)
            .and_then(|()| file.sync_all())
            .map_err(|e| CheckpointError::io(&path, &e))?;
        Ok(json.len() as u64)
    }

    /// The bytes of `tag_dir/name`, after checking that the manifest lists it and that its
    /// size and digest are the ones saved.
    pub fn verified_bytes(&self, tag_dir: &Path, name: &str) -> Result<Vec<u8>, CheckpointError> {
        let path: PathBuf = tag_dir.join(name);
        let Some(saved) = self.files.get(name) else {
            return Err(CheckpointError::corrupt(
                &path,
                "manifest",
                format!("the file is not listed in {MANIFEST}; it does not belong to this tag"),
            ));
        };
        if !user_file::exists(&path) {
            return Err(CheckpointError::Missing {
                path,
                what: "checkpoint file listed in manifest.json",
            });
        }
        let bytes = user_file::read(&path, FileKind::CheckpointTensors)
            .map_err(|e| CheckpointError::io(&path, &e))?;
        let found = file_digest(&bytes);
        if bytes.len() as u64 != saved.bytes || found != saved.crc32 {
            return Err(CheckpointError::corrupt(
                &path,
                "crc32",
                format!(
                    "expected {} ({} bytes) as {MANIFEST} records, found {found} ({} bytes): \
                     the file changed after it was saved; resume from another tag",
                    saved.crc32,
                    saved.bytes,
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_is_named_with_both_digests() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("a.bin"), b"hello").expect("write");
        let manifest = Manifest::of_directory(dir.path(), 3).expect("manifest");
        manifest.write(dir.path()).expect("written");
        let read = Manifest::read(dir.path(), "global_step3").expect("read");
        assert_eq!(read, manifest);
        assert_eq!(
            read.verified_bytes(dir.path(), "a.bin").expect("intact"),
            b"hello"
        );
        std::fs::write(dir.path().join("a.bin"), b"hellp").expect("write");
        let error = read
            .verified_bytes(dir.path(), "a.bin")
            .expect_err("changed")
            .to_string();
        assert!(error.contains("a.bin"), "{error}");
        assert!(error.contains(&file_digest(b"hello")), "{error}");
        assert!(error.contains(&file_digest(b"hellp")), "{error}");
        let error = read
            .verified_bytes(dir.path(), "b.bin")
            .expect_err("unlisted");
        assert!(error.to_string().contains("not listed"), "{error}");
        let error = Manifest::read(dir.path(), "global_step4").expect_err("another tag");
        assert!(error.to_string().contains("global_step3"), "{error}");
    }
}
