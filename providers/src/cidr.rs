//! Source ranges (a Service's `loadBalancerSourceRanges`) as CIDRs.

use std::net::IpAddr;

/// `text` as a canonical CIDR: the address with its host bits cleared and the prefix length, for
/// IPv4 (`10.1.2.3/8` → `10.0.0.0/8`) and IPv6 (lower case, compressed). Kubernetes accepts
/// host bits in `loadBalancerSourceRanges`; clouds store the network, so rules compare equal only
/// in this form. Surrounding spaces are ignored, as Kubernetes does.
pub fn canonical(text: &str) -> Result<String, String> {
    let bad = || format!("{text:?} is not a CIDR (like 203.0.113.0/24 or 2001:db8::/32)");
    let (addr, len) = text.trim().split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    match addr {
        IpAddr::V4(v4) if len <= 32 => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            Ok(format!("{}/{len}", std::net::Ipv4Addr::from(u32::from(v4) & mask)))
        }
        IpAddr::V6(v6) if len <= 128 => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            Ok(format!("{}/{len}", std::net::Ipv6Addr::from(u128::from(v6) & mask)))
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::canonical;

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
}
