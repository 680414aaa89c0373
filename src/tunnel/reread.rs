//! The client's configuration is a file of a Secret volume. The kubelet rewrites it when the
//! Secret changes, through a symlink swap that file watchers (rathole's included) do not see as a
//! change of the file; and a Pod started between two writes of the Secret (two operators by
//! mistake, or an edit racing a roll) can read an older Secret than its template's checksum names,
//! so no roll follows. The client therefore compares the file's bytes with what it loaded and ends
//! when they differ: the kubelet starts it again, and it reads the file as it is now.

use std::path::PathBuf;
use std::time::Duration;

/// How often the client compares its configuration file with what it loaded.
pub const EVERY: Duration = Duration::from_secs(5);

/// Returns once the file at `path` holds other bytes than `loaded`. A file that cannot be read
/// (the kubelet swapping its directory) is tried again at the next look, not taken as a change.
pub async fn changed(path: PathBuf, loaded: Vec<u8>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if tokio::fs::read(&path).await.is_ok_and(|now| now != loaded) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_rewritten_file_is_a_change_and_a_missing_or_equal_one_is_not() {
        let dir = std::env::temp_dir().join(format!("skyport-reread-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("client.toml");
        std::fs::write(&path, "a").unwrap();
        let watch = tokio::spawn(changed(path.clone(), b"a".to_vec(), Duration::from_millis(10)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::fs::remove_file(&path).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::fs::write(&path, "a").unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!watch.is_finished(), "the same bytes, or none for a moment, are no change");
        std::fs::write(&path, "b").unwrap();
        tokio::time::timeout(Duration::from_secs(5), watch).await.expect("a change ends the wait").unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
