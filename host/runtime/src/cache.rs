//! The on-disk cache of precompiled plugin code.
//!
//! Entries are keyed by (component digest, engine configuration hash), so a
//! host upgrade or an engine setting change never loads stale code. All file
//! access goes through a `cap-std` directory handle: a name can never reach
//! outside the cache directory. Writes go to a temporary name and are renamed
//! into place, so a crash never leaves a half-written entry under a real key.
//!
//! Precompiled code is native code: the directory must be writable only by
//! the host (it is created with mode 0700).

use crate::Error;
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory of precompiled components.
#[derive(Debug)]
pub struct CodeCache {
    dir: Dir,
    path: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl CodeCache {
    /// Open (creating if needed) the cache at `path`.
    pub fn open(path: &Path) -> Result<Self, Error> {
        let io = |error| Error::Io {
            what: format!("cannot open the precompiled-code cache {}", path.display()),
            error,
        };
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(path).map_err(io)?;
        let dir = Dir::open_ambient_dir(path, ambient_authority()).map_err(io)?;
        Ok(CodeCache {
            dir,
            path: path.to_path_buf(),
        })
    }

    /// Where the cache lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry name for a component digest (`sha256:<hex>`) and engine hash.
    pub(crate) fn key(digest: &str, engine_hash: &str) -> String {
        format!("{}-{engine_hash}.cwasm", digest.replace(':', "-"))
    }

    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.dir.read(key).ok()
    }

    pub(crate) fn put(&self, key: &str, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = format!(
            ".{key}.{}-{}.tmp",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        self.dir.write(&tmp, bytes)?;
        self.dir.rename(&tmp, &self.dir, key).inspect_err(|_| {
            let _ = self.dir.remove_file(&tmp);
        })
    }

    /// Remove an entry (a corrupt or incompatible one).
    pub(crate) fn remove(&self, key: &str) {
        let _ = self.dir.remove_file(key);
    }

    /// Number of entries, for tests and `inspect`.
    pub fn len(&self) -> usize {
        self.dir
            .entries()
            .map(|e| {
                e.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
