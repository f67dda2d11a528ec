//! The one place a command's output paths are set against its input paths, before any file is
//! opened: an output that is also an input (`run c.json --metrics c.json`), that lies inside
//! an input directory (`--metrics MODEL_DIR/config.json`) or inside another output directory
//! (`--metrics CKPT/latest`), or that is another output (`--metrics m --save-model m`), is
//! refused naming both flags.
//!
//! A FIFO or character device as an output is written through, never replaced, and is left
//! out of the comparison. Paths are compared as the file system sees them: symlinks and `..` resolved (a path that
//! does not exist yet through its nearest existing ancestor), and existing files by device and
//! inode, so a hard link or a bind of the same file is the same file.

use std::path::{Component, Path, PathBuf};

/// Whether a path names a file or a directory the command reads or writes as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One file.
    File,
    /// A directory and what is in it.
    Directory,
}

/// Which way a path is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Input,
    Output,
}

/// One path given on the command line.
#[derive(Debug, Clone)]
struct Named {
    flag: String,
    given: PathBuf,
    resolved: PathBuf,
    identity: Option<(u64, u64)>,
    shape: Shape,
    direction: Direction,
    /// A FIFO or character device (`/dev/null`): written through, never replaced, so two
    /// outputs may share it and nothing there is destroyed.
    stream: bool,
}

/// A pair the command allows although the paths meet (`--resume CKPT --save-checkpoint CKPT`
/// continues a run in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// The input's flag.
    pub input: &'static str,
    /// The output's flag.
    pub output: &'static str,
}

/// The inputs and outputs of one command.
#[derive(Debug, Default)]
pub struct Paths {
    named: Vec<Named>,
    allowed: Vec<Allowed>,
}

impl Paths {
    /// Records an input.
    pub fn input(&mut self, flag: &str, path: &Path, shape: Shape) -> &mut Self {
        self.push(flag, path, shape, Direction::Input)
    }

    /// Records an output.
    pub fn output(&mut self, flag: &str, path: &Path, shape: Shape) -> &mut Self {
        self.push(flag, path, shape, Direction::Output)
    }

    /// Allows `input` and `output` to meet.
    pub fn allow(&mut self, allowed: Allowed) -> &mut Self {
        self.allowed.push(allowed);
        self
    }

    fn push(&mut self, flag: &str, path: &Path, shape: Shape, direction: Direction) -> &mut Self {
        self.named.push(Named {
            flag: flag.to_string(),
            given: path.to_path_buf(),
            resolved: resolve(path),
            identity: identity(path),
            shape,
            direction,
            stream: is_stream(path),
        });
        self
    }

    /// The first clash between an output and another path, as a message naming both flags and
    /// what to do; `Ok` when every output stands apart.
    pub fn check(&self) -> Result<(), String> {
        for (i, output) in self.named.iter().enumerate() {
            if output.direction != Direction::Output || output.stream {
                continue;
            }
            for (j, other) in self.named.iter().enumerate() {
                if i == j || (other.direction == Direction::Output && j < i) {
                    continue;
                }
                if self.is_allowed(output, other) {
                    continue;
                }
                if let Some(problem) = clash(output, other) {
                    return Err(problem);
                }
            }
        }
        Ok(())
    }

    fn is_allowed(&self, output: &Named, other: &Named) -> bool {
        other.direction == Direction::Input
            && self
                .allowed
                .iter()
                .any(|a| a.output == output.flag && a.input == other.flag)
    }
}

/// What is wrong when `output` meets `other`, if it does.
fn clash(output: &Named, other: &Named) -> Option<String> {
    let out = shown(output);
    let them = shown(other);
    let role = match other.direction {
        Direction::Input => "reads",
        Direction::Output => "writes",
    };
    if same(output, other) {
        return Some(format!(
            "{out} names the same {} as {them}, which this run {role}: writing it would destroy \
             it; name another path for {}",
            noun(output.shape),
            output.flag
        ));
    }
    if other.shape == Shape::Directory && output.resolved.starts_with(&other.resolved) {
        return Some(format!(
            "{out} lies inside {them}, which this run {role}: writing there would change it; \
             name a path outside it for {}",
            output.flag
        ));
    }
    if output.shape == Shape::Directory && other.resolved.starts_with(&output.resolved) {
        return Some(format!(
            "{them} lies inside {out}, which this run writes: keep what it {role} outside it, \
             or name another directory for {}",
            output.flag
        ));
    }
    None
}

fn shown(named: &Named) -> String {
    format!(
        "{} {}",
        named.flag,
        crate::render::escape_controls(&named.given.display().to_string())
    )
}

fn noun(shape: Shape) -> &'static str {
    match shape {
        Shape::File => "file",
        Shape::Directory => "directory",
    }
}

fn same(a: &Named, b: &Named) -> bool {
    a.resolved == b.resolved || (a.identity.is_some() && a.identity == b.identity)
}

/// Whether `path` names a FIFO or a character device (through symlinks).
#[cfg(unix)]
fn is_stream(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| {
        let kind = m.file_type();
        kind.is_fifo() || kind.is_char_device()
    })
}

#[cfg(not(unix))]
fn is_stream(_: &Path) -> bool {
    false
}

/// Device and inode of what `path` names, when it exists.
#[cfg(unix)]
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(_: &Path) -> Option<(u64, u64)> {
    None
}

/// `path` as the file system resolves it: absolute, symlinks and `..` resolved through its
/// nearest existing ancestor, the rest (which does not exist yet) appended with `.` and `..`
/// taken lexically.
pub fn resolve(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path)
    };
    let mut missing: Vec<std::ffi::OsString> = Vec::new();
    let mut existing = absolute.as_path();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            let mut resolved = real;
            for part in missing.iter().rev() {
                match Path::new(part).components().next() {
                    Some(Component::ParentDir) => {
                        resolved.pop();
                    }
                    Some(Component::CurDir) | None => {}
                    _ => resolved.push(part),
                }
            }
            return resolved;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_os_string());
                existing = parent;
            }
            // `..` or `.` as the last component of a path that does not resolve: drop it.
            (Some(parent), None) => {
                missing.push(std::ffi::OsString::from(".."));
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(dir: &Path) -> (PathBuf, PathBuf) {
        let config = dir.join("c.json");
        std::fs::write(&config, b"{}").expect("write");
        (config, dir.join("ckpt"))
    }

    #[test]
    fn an_output_that_is_an_input_is_refused_naming_both_flags() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (config, _) = paths(dir.path());
        let mut p = Paths::default();
        p.input("FILE", &config, Shape::File)
            .output("--metrics", &config, Shape::File);
        let error = p.check().expect_err("the config as metrics");
        assert!(error.starts_with("--metrics "), "{error}");
        assert!(error.contains("as FILE "), "{error}");
    }

    #[test]
    fn dot_dot_and_symlinks_do_not_hide_a_clash() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (config, _) = paths(dir.path());
        std::fs::create_dir(dir.path().join("sub")).expect("dir");
        let dotted = dir.path().join("sub/../c.json");
        let mut p = Paths::default();
        p.input("FILE", &config, Shape::File)
            .output("--save-model", &dotted, Shape::File);
        assert!(p.check().is_err());
        #[cfg(unix)]
        {
            let link = dir.path().join("link.json");
            std::os::unix::fs::symlink(&config, &link).expect("symlink");
            let hard = dir.path().join("hard.json");
            std::fs::hard_link(&config, &hard).expect("hard link");
            for alias in [link, hard] {
                let mut p = Paths::default();
                p.input("FILE", &config, Shape::File)
                    .output("--metrics", &alias, Shape::File);
                assert!(p.check().is_err(), "{}", alias.display());
            }
        }
    }

    #[test]
    fn a_file_inside_an_output_directory_and_two_equal_outputs_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (config, ckpt) = paths(dir.path());
        let mut p = Paths::default();
        p.input("FILE", &config, Shape::File)
            .output("--save-checkpoint", &ckpt, Shape::Directory)
            .output("--metrics", &ckpt.join("latest"), Shape::File);
        let error = p.check().expect_err("metrics in the checkpoints");
        assert!(error.contains("lies inside --save-checkpoint"), "{error}");
        let mut p = Paths::default();
        let out = dir.path().join("out");
        p.output("--metrics", &out, Shape::File).output(
            "--save-model",
            &dir.path().join("./out"),
            Shape::File,
        );
        let error = p.check().expect_err("one file twice");
        assert!(error.contains("which this run writes"), "{error}");
    }

    #[test]
    fn separate_paths_and_allowed_pairs_pass() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (config, ckpt) = paths(dir.path());
        let mut p = Paths::default();
        p.input("FILE", &config, Shape::File)
            .input("--resume", &ckpt, Shape::Directory)
            .output("--save-checkpoint", &ckpt, Shape::Directory)
            .output("--metrics", &dir.path().join("m.jsonl"), Shape::File)
            .allow(Allowed {
                input: "--resume",
                output: "--save-checkpoint",
            });
        p.check().expect("apart");
    }
}
