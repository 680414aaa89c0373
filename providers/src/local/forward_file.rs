//! The forward file and its acknowledgement, as the local provider and `skyport tunnel server
//! --forward-file` read and write them: one line, `<generation> <address>`, or `<generation>`
//! alone when the server is to forward nothing. The provider bumps the generation with every
//! request and the server echoes the request it listens for in `forward.bound`, so an
//! acknowledgement written for an earlier request (the same address taken off the host and
//! given back before its server looked again) never answers a later one.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// In a host's folder: the reserved address its server forwards to its own listeners, if any.
pub const FORWARD_FILE: &str = "forward";

/// How the server's log line saying a port of the forwarded address did not bind begins: the
/// server writes it, the provider quotes it when a move is not acknowledged.
pub const FORWARD_REFUSED: &str = "cannot forward";

/// Where `skyport tunnel server` acknowledges the forward file `file`: `forward.bound` beside
/// `forward`, repeating the request once it listens on every port of its address.
pub fn bound_file(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".bound");
    PathBuf::from(name)
}

/// One request of the forward file, or the server's acknowledgement of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forward {
    /// Increases with every request to the same host.
    pub generation: u64,
    /// What to forward; none stops forwarding.
    pub address: Option<Ipv4Addr>,
}

impl Forward {
    /// Parses a file's text; an empty one is generation 0, forwarding nothing, as a host whose
    /// forward file was never written.
    pub fn parse(text: &str) -> Result<Forward, String> {
        let mut words = text.split_whitespace();
        let Some(generation) = words.next() else { return Ok(Forward::default()) };
        let generation = generation.parse().map_err(|_| format!("{generation:?} is not a generation number"))?;
        let address = match words.next() {
            Some(address) => Some(address.parse().map_err(|_| format!("{address:?} is not an IPv4 address"))?),
            None => None,
        };
        if let Some(extra) = words.next() {
            return Err(format!("unexpected {extra:?} after the address"));
        }
        Ok(Forward { generation, address })
    }

    /// The file at `path`; a missing file is none.
    pub fn read(path: &Path) -> Result<Option<Forward>, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => Forward::parse(&text).map(Some).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// The file's text.
    pub fn render(&self) -> String {
        match self.address {
            Some(address) => format!("{} {address}\n", self.generation),
            None => format!("{}\n", self.generation),
        }
    }

    /// The next request to the host whose forward file is `file`: a generation above both the
    /// last request's and its acknowledgement's, so no acknowledgement already on disk matches
    /// it. Unreadable files count as generation 0: they are replaced.
    pub fn next(file: &Path, address: Option<Ipv4Addr>) -> Result<Forward, String> {
        let generation = |path: &Path| Forward::read(path).ok().flatten().map_or(0, |f| f.generation);
        let last = generation(file).max(generation(&bound_file(file)));
        let generation = last.checked_add(1).ok_or_else(|| {
            format!("{} and its acknowledgement have run out of generations; remove both", file.display())
        })?;
        Ok(Forward { generation, address })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: Ipv4Addr = Ipv4Addr::new(10, 204, 0, 3);

    #[test]
    fn a_request_reads_back_as_written() {
        for forward in [Forward { generation: 7, address: Some(IP) }, Forward { generation: 8, address: None }] {
            assert_eq!(Forward::parse(&forward.render()), Ok(forward));
        }
        assert_eq!(Forward::parse(""), Ok(Forward::default()), "an empty file forwards nothing");
    }

    #[test]
    fn a_malformed_file_is_an_error_naming_what_is_wrong() {
        for (text, says) in [
            ("10.204.0.3\n", "not a generation"),
            ("-1 10.204.0.3", "not a generation"),
            ("99999999999999999999999 10.204.0.3", "not a generation"),
            ("3 10.204.0.300", "not an IPv4"),
            ("3 ::1", "not an IPv4"),
            ("3 10.204.0.3 10.204.0.4", "unexpected"),
            ("\u{0}\u{ff}", "not a generation"),
        ] {
            let error = Forward::parse(text).unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }

    #[test]
    fn an_acknowledgement_on_disk_never_answers_the_next_request() {
        let dir = std::env::temp_dir().join(format!("skyport-forward-file-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(FORWARD_FILE);
        let first = Forward::next(&file, Some(IP)).unwrap();
        assert_eq!(first.generation, 1, "a host never asked starts at 1");
        // The server acknowledged the address, then the provider took it off the host; the
        // server has not looked again, so its acknowledgement still names the address.
        std::fs::write(bound_file(&file), first.render()).unwrap();
        std::fs::write(&file, Forward::next(&file, None).unwrap().render()).unwrap();
        let again = Forward::next(&file, Some(IP)).unwrap();
        assert_eq!(again.generation, 3);
        assert_ne!(Forward::read(&bound_file(&file)), Ok(Some(again)));
        // A forward file lost or garbled still yields a generation above the acknowledgement's.
        std::fs::write(&file, "garbage").unwrap();
        assert_eq!(Forward::next(&file, Some(IP)).unwrap().generation, 2);
        std::fs::write(bound_file(&file), format!("{} {IP}", u64::MAX)).unwrap();
        assert!(Forward::next(&file, Some(IP)).unwrap_err().contains("run out of generations"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
