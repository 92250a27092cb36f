//! One container log's files on disk: the log the runtime writes (`<log>`, e.g. `.../app/0.log`) and its
//! rotated predecessors (`<log>.<YYYYMMDD-hhmmss>`, older ones gzipped to `<log>.<time>.gz`).
//!
//! A rotation, as the kubelet's: files left by a rotation that failed half-way are removed (a `.tmp` of an
//! unfinished compression, a plain file whose `.gz` was already written); the oldest rotated files are removed
//! until `maxFiles - 2` remain (the log being renamed and the new one the runtime opens make up the rest); the
//! remaining plain rotated files are gzipped; last, the log is renamed to `<log>.<time>`. Only the newest
//! rotated file stays plain, so a reader that had the log open can finish it. Blocking file I/O: callers run it
//! off the async threads.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

/// The suffix of a compressed rotated log.
const COMPRESSED: &str = ".gz";
/// The suffix of a compression in progress.
const TEMPORARY: &str = ".tmp";

/// A file operation of the rotation that failed, with the file it was about.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {source}", path.display())]
pub struct FileError {
    /// What was being done.
    what: &'static str,
    /// The file.
    path: PathBuf,
    #[source]
    source: io::Error,
}

fn at<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FileError + 'a {
    move |source| FileError {
        what,
        path: path.to_owned(),
        source,
    }
}

/// The rotated files of `log` (every `<log>.<anything>` beside it), oldest first: their names sort by the time
/// they carry.
pub(crate) fn rotated(log: &Path) -> Result<Vec<PathBuf>, FileError> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name().and_then(|n| n.to_str())) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{name}.");
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(at("listing", dir))? {
        let entry = entry.map_err(at("listing", dir))?;
        if entry.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Whether rotated file `path` (one of `all`) is left over from a failed rotation: an unfinished compression,
/// or a plain file already compressed.
fn is_leftover(path: &Path, all: &[PathBuf]) -> bool {
    let text = path.as_os_str().to_string_lossy();
    if text.ends_with(TEMPORARY) {
        return true;
    }
    if text.ends_with(COMPRESSED) {
        return false;
    }
    let compressed = format!("{text}{COMPRESSED}");
    all.iter().any(|p| p.as_os_str().to_string_lossy() == compressed)
}

/// The rotated files a reader of `log` may still want, oldest first, the log itself last (the kubelet's
/// `GetAllLogs`).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn in_use(log: &Path) -> Result<Vec<PathBuf>, FileError> {
    let all = rotated(log)?;
    let mut out: Vec<PathBuf> = all.iter().filter(|p| !is_leftover(p, &all)).cloned().collect();
    out.push(log.to_owned());
    Ok(out)
}

/// Gzips `path` to `<path>.gz` (through `<path>.tmp`, renamed when complete) and removes `path`.
fn compress(path: &Path) -> Result<(), FileError> {
    let tmp = PathBuf::from(format!("{}{TEMPORARY}", path.display()));
    let done = PathBuf::from(format!("{}{COMPRESSED}", path.display()));
    let result = (|| {
        let mut input = File::open(path).map_err(at("opening", path))?;
        let mode = input.metadata().map_err(at("reading", path))?.permissions();
        let output = File::create(&tmp).map_err(at("creating", &tmp))?;
        output
            .set_permissions(mode)
            .map_err(at("setting the mode of", &tmp))?;
        let mut gz = flate2::write::GzEncoder::new(output, flate2::Compression::default());
        io::copy(&mut input, &mut gz).map_err(at("compressing into", &tmp))?;
        gz.finish()
            .and_then(|f| f.sync_all())
            .map_err(at("compressing into", &tmp))?;
        fs::rename(&tmp, &done).map_err(at("renaming", &tmp))
    })();
    if result.is_err() {
        // best effort: the next rotation removes a leftover .tmp anyway
        let _ = fs::remove_file(&tmp);
    }
    result?;
    fs::remove_file(path).map_err(at("removing", path))
}

/// Makes room for a new rotated file of `log` and renames `log` to `<log>.<stamp>` (see the module): returns the
/// new rotated file's path, for renaming back should the runtime fail to reopen its log.
pub(crate) fn rotate(log: &Path, max_files: usize, stamp: &str) -> Result<PathBuf, FileError> {
    let all = rotated(log)?;
    let mut kept = Vec::with_capacity(all.len());
    for path in &all {
        if is_leftover(path, &all) {
            fs::remove_file(path).map_err(at("removing", path))?;
        } else {
            kept.push(path.clone());
        }
    }
    // the log being renamed and the one the runtime opens next count among the files kept
    let excess = kept.len().saturating_sub(max_files.saturating_sub(2));
    for path in kept.drain(..excess) {
        fs::remove_file(&path).map_err(at("removing", &path))?;
    }
    for path in &kept {
        if !path.as_os_str().to_string_lossy().ends_with(COMPRESSED) {
            compress(path)?;
        }
    }
    let target = PathBuf::from(format!("{}.{stamp}", log.display()));
    fs::rename(log, &target).map_err(at("renaming", log))?;
    Ok(target)
}

/// Renames a rotated file back to the log (the runtime kept writing the renamed file: it is the log still).
pub(crate) fn restore(rotated: &Path, log: &Path) -> Result<(), FileError> {
    fs::rename(rotated, log).map_err(at("renaming", rotated))
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        out.sort();
        out
    }

    fn gunzip(path: &Path) -> String {
        let mut text = String::new();
        flate2::read::GzDecoder::new(File::open(path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    #[test]
    fn a_rotation_keeps_max_files_compresses_all_but_the_newest_and_removes_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        // another container's (or attempt's) log beside it is never touched
        fs::write(dir.path().join("1.log"), "other").unwrap();
        fs::write(dir.path().join("1.log.20260101-000000"), "other rotated").unwrap();
        for (i, stamp) in [
            "20260101-000001",
            "20260101-000002",
            "20260101-000003",
            "20260101-000004",
        ]
        .into_iter()
        .enumerate()
        {
            fs::write(&log, format!("generation {i}\n")).unwrap();
            let target = rotate(&log, 3, stamp).unwrap();
            assert_eq!(target, dir.path().join(format!("0.log.{stamp}")));
            assert!(!log.exists(), "the log is renamed; the runtime opens a new one");
        }
        // 3 files: one compressed, the newest rotated plain, and the log the runtime opens next
        assert_eq!(
            names(dir.path()),
            [
                "0.log.20260101-000003.gz",
                "0.log.20260101-000004",
                "1.log",
                "1.log.20260101-000000"
            ]
        );
        assert_eq!(
            gunzip(&dir.path().join("0.log.20260101-000003.gz")),
            "generation 2\n"
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("0.log.20260101-000004")).unwrap(),
            "generation 3\n"
        );
        fs::write(&log, "current").unwrap();
        let in_use: Vec<String> = in_use(&log)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            in_use,
            ["0.log.20260101-000003.gz", "0.log.20260101-000004", "0.log"]
        );
    }

    #[test]
    fn more_files_kept_means_more_compressed_generations() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        for i in 0..8 {
            fs::write(&log, format!("generation {i}\n")).unwrap();
            rotate(&log, 5, &format!("20260101-00000{i}")).unwrap();
        }
        fs::write(&log, "current").unwrap();
        let files = in_use(&log).unwrap();
        assert_eq!(files.len(), 5, "{files:?}");
        let gz: Vec<String> = files[..3].iter().map(|p| gunzip(p)).collect();
        assert_eq!(gz, ["generation 4\n", "generation 5\n", "generation 6\n"]);
    }

    #[test]
    fn leftovers_of_a_failed_rotation_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let old = dir.path().join("0.log.20260101-000001");
        // a compression that finished without removing its source, and one that never finished
        fs::write(&old, "old").unwrap();
        fs::write(dir.path().join("0.log.20260101-000001.gz"), "").unwrap();
        fs::write(dir.path().join("0.log.20260101-000002"), "two").unwrap();
        fs::write(dir.path().join("0.log.20260101-000002.tmp"), "partial").unwrap();
        fs::write(&log, "now").unwrap();
        let in_use: Vec<PathBuf> = in_use(&log).unwrap();
        assert_eq!(
            in_use,
            [
                dir.path().join("0.log.20260101-000001.gz"),
                dir.path().join("0.log.20260101-000002"),
                log.clone()
            ]
        );
        rotate(&log, 5, "20260101-000003").unwrap();
        assert_eq!(
            names(dir.path()),
            [
                "0.log.20260101-000001.gz",
                "0.log.20260101-000002.gz",
                "0.log.20260101-000003"
            ]
        );
        assert_eq!(gunzip(&dir.path().join("0.log.20260101-000002.gz")), "two");
    }

    #[test]
    fn a_restored_rotation_is_the_log_again() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        fs::write(&log, "still written").unwrap();
        let target = rotate(&log, 5, "20260101-000001").unwrap();
        restore(&target, &log).unwrap();
        assert_eq!(names(dir.path()), ["0.log"]);
        assert_eq!(fs::read_to_string(&log).unwrap(), "still written");
    }

    #[test]
    fn a_missing_log_fails_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = rotate(&dir.path().join("0.log"), 5, "20260101-000001").unwrap_err();
        assert!(err.to_string().contains("0.log"), "{err}");
    }
}
