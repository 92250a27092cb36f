//! The certificate directory, laid out as the kubelet lays it out: each certificate with its key in
//! `<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem` (mode 0600), `<prefix>-current.pem` a symlink to the newest (swapped
//! atomically), and a key waiting for its first certificate in `<prefix>.key.tmp`, so that an agent restarted
//! before the cluster answered asks again with the same key.

use std::path::{Path, PathBuf};

use super::{CertError, CertPair};

/// The certificates of one kind (`kubelet-client`, `kubelet-server`) in a directory.
#[derive(Debug, Clone)]
pub struct CertStore {
    dir: PathBuf,
    prefix: String,
}

impl CertStore {
    /// The `prefix` certificates under `dir` (created when first written).
    pub fn new(dir: impl Into<PathBuf>, prefix: &str) -> Self {
        Self {
            dir: dir.into(),
            prefix: prefix.to_owned(),
        }
    }

    /// `<dir>/<prefix>-current.pem`.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    fn pending_key_path(&self) -> PathBuf {
        self.dir.join(format!("{}.key.tmp", self.prefix))
    }

    /// The current certificate, or `None` when there is none yet.
    pub fn load(&self) -> Result<Option<CertPair>, CertError> {
        let path = self.current_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => CertPair::parse(&text, &text, &path.display().to_string()).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CertError::io(&path, e)),
        }
    }

    /// Writes `pair` as the newest certificate and points `<prefix>-current.pem` at it; returns the current
    /// path.
    pub fn save(&self, pair: &CertPair) -> Result<PathBuf, CertError> {
        self.ensure_dir()?;
        let stamp = file_stamp(time::OffsetDateTime::now_utc());
        let file_name = format!("{}-{stamp}.pem", self.prefix);
        let file = self.dir.join(&file_name);
        write_private(&file, format!("{}{}", pair.cert_pem, pair.key_pem).as_bytes())?;
        let current = self.current_path();
        let staged = self.dir.join(format!("{}-current.pem.new", self.prefix));
        let _ = std::fs::remove_file(&staged);
        std::os::unix::fs::symlink(&file_name, &staged).map_err(|e| CertError::io(&staged, e))?;
        std::fs::rename(&staged, &current).map_err(|e| CertError::io(&current, e))?;
        Ok(current)
    }

    /// The key kept for a request not yet answered, or a new one (kept until [`CertStore::drop_pending_key`]).
    pub fn pending_key(&self) -> Result<rcgen::KeyPair, CertError> {
        let path = self.pending_key_path();
        match std::fs::read_to_string(&path) {
            Ok(pem) => match rcgen::KeyPair::from_pem(&pem) {
                Ok(key) => return Ok(key),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "unusable pending key; making a new one")
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(CertError::io(&path, e)),
        }
        let key = super::csr::new_key()?;
        self.ensure_dir()?;
        write_private(&path, key.serialize_pem().as_bytes())?;
        Ok(key)
    }

    /// Forgets the pending key (its certificate is stored).
    pub fn drop_pending_key(&self) {
        let _ = std::fs::remove_file(self.pending_key_path());
    }

    fn ensure_dir(&self) -> Result<(), CertError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| CertError::io(&self.dir, e))
    }
}

/// Writes a certificate or key file (mode 0600) atomically: a crash or a full disk leaves the old file or the
/// new one, never a truncated one.
fn write_private(path: &Path, data: &[u8]) -> Result<(), CertError> {
    crate::state_file::write_atomic(path, data, 0o600).map_err(|e| CertError::io(path, e))
}

/// `2026-11-24-12-30-05` for that UTC time.
fn file_stamp(t: time::OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}-{:02}-{:02}-{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}
