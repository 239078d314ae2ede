//! The content-addressed local store: blobs by digest, plus small records
//! (verification results) keyed by digest. All file access goes through a
//! `cap-std` directory handle, so no name can reach outside the cache
//! directory, and every read is checked against its digest (a corrupted
//! entry is dropped and fetched again, never used).

use crate::{Digest, Error};
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A blob cache rooted at one directory.
#[derive(Debug)]
pub struct Cache {
    root: PathBuf,
    dir: Dir,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Cache {
    /// Open (creating if needed) the cache at `root`.
    pub fn open(root: &Path) -> Result<Cache, Error> {
        std::fs::create_dir_all(root).map_err(Error::io(root))?;
        let dir = Dir::open_ambient_dir(root, ambient_authority()).map_err(Error::io(root))?;
        for sub in ["blobs/sha256", "records", "tmp"] {
            dir.create_dir_all(sub).map_err(Error::io(root.join(sub)))?;
        }
        Ok(Cache {
            root: root.to_path_buf(),
            dir,
        })
    }

    /// Where the cache lives.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn blob_path(digest: &Digest) -> String {
        format!("blobs/sha256/{}", digest.hex())
    }

    /// The blob, if cached and intact.
    pub fn get(&self, digest: &Digest) -> Result<Option<Vec<u8>>, Error> {
        let path = Self::blob_path(digest);
        match self.dir.read(&path) {
            Ok(bytes) if &Digest::of(&bytes) == digest => Ok(Some(bytes)),
            Ok(_) => {
                // Corrupted on disk: forget it, the caller fetches again.
                let _ = self.dir.remove_file(&path);
                Ok(None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(self.root.join(path))(e)),
        }
    }

    /// Store a blob (its digest is checked first).
    pub fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<(), Error> {
        digest.check("blob to cache", bytes)?;
        self.write_atomically(&Self::blob_path(digest), bytes)
    }

    /// A small record stored under `name` (`[a-z0-9-]+`).
    pub fn record(&self, name: &str) -> Result<Option<Vec<u8>>, Error> {
        let path = format!("records/{}", checked_name(name)?);
        match self.dir.read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(self.root.join(path))(e)),
        }
    }

    /// Store a small record under `name`.
    pub fn put_record(&self, name: &str, bytes: &[u8]) -> Result<(), Error> {
        let path = format!("records/{}", checked_name(name)?);
        self.write_atomically(&path, bytes)
    }

    fn write_atomically(&self, path: &str, bytes: &[u8]) -> Result<(), Error> {
        let temp = format!(
            "tmp/{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        self.dir
            .write(&temp, bytes)
            .map_err(Error::io(self.root.join(&temp)))?;
        self.dir
            .rename(&temp, &self.dir, path)
            .map_err(Error::io(self.root.join(path)))
    }
}

fn checked_name(name: &str) -> Result<&str, Error> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(Error::config(
            "cache record name",
            format!("{name:?} is not [a-z0-9-]+"),
        ));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_by_digest_and_drops_corrupted_entries() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let d = Digest::of(b"component");
        assert_eq!(cache.get(&d).unwrap(), None);
        assert!(cache.put(&d, b"other bytes").is_err());
        cache.put(&d, b"component").unwrap();
        assert_eq!(cache.get(&d).unwrap().as_deref(), Some(&b"component"[..]));
        std::fs::write(dir.path().join("blobs/sha256").join(d.hex()), b"evil").unwrap();
        assert_eq!(
            cache.get(&d).unwrap(),
            None,
            "a corrupted blob is never returned"
        );
        assert!(cache.put_record("../x", b"").is_err());
        cache.put_record("verified-abc", b"{}").unwrap();
        assert_eq!(
            cache.record("verified-abc").unwrap().as_deref(),
            Some(&b"{}"[..])
        );
    }
}
