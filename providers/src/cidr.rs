//! Source ranges (a Service's `loadBalancerSourceRanges`) as CIDRs.

use std::net::IpAddr;

/// A network: an address with its host bits cleared and a prefix length. Rendered back as text
/// it is canonical ([`canonical`]), which is how firewalls (a security group, the exit server's
/// nftables ruleset) are given ranges: never as the text a user typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    /// Parses `text` (host bits allowed, cleared; surrounding spaces ignored, as Kubernetes does).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let bad = || format!("{text:?} is not a CIDR (like 203.0.113.0/24 or 2001:db8::/32)");
        let (addr, len) = text.trim().split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let len: u8 = len.parse().map_err(|_| bad())?;
        let addr = match addr {
            IpAddr::V4(v4) if len <= 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                IpAddr::V4(std::net::Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) if len <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & mask))
            }
            _ => return Err(bad()),
        };
        Ok(Cidr { addr, len })
    }

    /// Parses `text` and refuses it unless it is already canonical (what skyport itself writes).
    pub fn parse_canonical(text: &str) -> Result<Cidr, String> {
        let cidr = Cidr::parse(text)?;
        if cidr.to_string() != text {
            return Err(format!("{text:?} is not in canonical form (write {cidr})"));
        }
        Ok(cidr)
    }

    /// Whether this is an IPv4 network.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// `text` as a canonical CIDR: the address with its host bits cleared and the prefix length, for
/// IPv4 (`10.1.2.3/8` → `10.0.0.0/8`) and IPv6 (lower case, compressed). Kubernetes accepts
/// host bits in `loadBalancerSourceRanges`; clouds store the network, so rules compare equal only
/// in this form. Surrounding spaces are ignored, as Kubernetes does.
pub fn canonical(text: &str) -> Result<String, String> {
    Cidr::parse(text).map(|c| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::{Cidr, canonical};

    #[test]
    fn ranges_are_canonical_networks_and_junk_is_named() {
        assert_eq!(canonical("203.0.113.0/24").unwrap(), "203.0.113.0/24");
        assert_eq!(canonical(" 10.1.2.3/8 ").unwrap(), "10.0.0.0/8");
        assert_eq!(canonical("0.0.0.0/0").unwrap(), "0.0.0.0/0");
        assert_eq!(canonical("198.51.100.7/32").unwrap(), "198.51.100.7/32");
        assert_eq!(canonical("2001:DB8::1/32").unwrap(), "2001:db8::/32");
        assert_eq!(canonical("::/0").unwrap(), "::/0");
        for bad in ["", "10.0.0.0", "10.0.0.0/33", "10.0.0/8", "::/129", "x/8", "10.0.0.0/-1", "10.0.0.0/8/8"] {
            let e = canonical(bad).unwrap_err();
            assert!(e.contains("is not a CIDR"), "{bad}: {e}");
        }
    }

    #[test]
    fn only_canonical_text_is_taken_as_written() {
        assert_eq!(Cidr::parse_canonical("2001:db8::/32").unwrap().to_string(), "2001:db8::/32");
        assert!(!Cidr::parse_canonical("2001:db8::/32").unwrap().is_ipv4());
        assert!(Cidr::parse_canonical("10.0.0.0/8").unwrap().is_ipv4());
        for (text, fix) in
            [("10.1.2.3/8", "10.0.0.0/8"), (" 10.0.0.0/8", "10.0.0.0/8"), ("2001:DB8::/32", "2001:db8::/32")]
        {
            let e = Cidr::parse_canonical(text).unwrap_err();
            assert!(e.contains("not in canonical form") && e.contains(fix), "{text}: {e}");
        }
        assert!(Cidr::parse_canonical("10.0.0.0/33").unwrap_err().contains("is not a CIDR"));
    }
}
