//! Per-node pod CIDRs carved from one fleet-wide range, for clusters whose controller-manager allocates no node
//! CIDRs (`--allocate-node-cidrs=false`): node `i` gets the `i`-th subnet of the range, handed to its fake
//! runtime at start, so its pod network is ready at once and its pod IPs are its own.
//!
//! Without this, a hollow node's runtime has no pod network until the Node's `spec.podCIDR` arrives (the node
//! stays NotReady with the runtime's `NetworkReady=false` reason, as a kubelet does). When the cluster assigns
//! a podCIDR anyway, that one wins: the agent hands it to the runtime like any kubelet.

use std::net::Ipv4Addr;

/// A fleet-wide range that cannot be carved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--node-pod-cidrs {range:?} with --node-cidr-mask-size {mask}: {reason}")]
pub struct CidrRangeError {
    /// The range as given.
    pub range: String,
    /// The per-node prefix length.
    pub mask: u8,
    /// What is wrong.
    pub reason: &'static str,
}

/// An IPv4 range split into equal per-node subnets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCidrs {
    base: u32,
    prefix: u8,
    mask: u8,
}

impl NodeCidrs {
    /// `range` (e.g. `10.64.0.0/10`) split into subnets of prefix length `mask` (e.g. 24).
    pub fn new(range: &str, mask: u8) -> Result<Self, CidrRangeError> {
        let err = |reason| CidrRangeError {
            range: range.to_owned(),
            mask,
            reason,
        };
        let (addr, prefix) = range
            .trim()
            .split_once('/')
            .ok_or_else(|| err("expected address/prefix"))?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| err("not an IPv4 address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| err("bad prefix length"))?;
        if prefix > 32 {
            return Err(err("prefix length too long"));
        }
        if mask < prefix || mask > 30 {
            return Err(err(
                "the per-node mask must be at least the range's prefix and at most 30",
            ));
        }
        let keep = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        Ok(Self {
            base: u32::from(addr) & keep,
            prefix,
            mask,
        })
    }

    /// How many node subnets the range holds.
    pub fn len(&self) -> u64 {
        1u64 << (self.mask - self.prefix)
    }

    /// Whether the range holds no subnet (never: a valid range holds at least one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The subnet of node `index`, or `None` past the end of the range.
    pub fn nth(&self, index: usize) -> Option<String> {
        let index = u64::try_from(index).ok().filter(|i| *i < self.len())?;
        let step = 1u64 << (32 - self.mask);
        let start = u64::from(self.base) + index * step;
        let start = Ipv4Addr::from(u32::try_from(start).ok()?);
        Some(format!("{start}/{}", self.mask))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_get_consecutive_subnets_of_the_range() {
        let c = NodeCidrs::new("10.64.0.0/10", 24).unwrap();
        assert_eq!(c.len(), 16_384);
        assert_eq!(c.nth(0).as_deref(), Some("10.64.0.0/24"));
        assert_eq!(c.nth(1).as_deref(), Some("10.64.1.0/24"));
        assert_eq!(c.nth(256).as_deref(), Some("10.65.0.0/24"));
        assert_eq!(c.nth(16_383).as_deref(), Some("10.127.255.0/24"));
        assert_eq!(c.nth(16_384), None, "past the range");
        let c = NodeCidrs::new("10.1.2.3/16", 26).unwrap();
        assert_eq!(
            c.nth(5).as_deref(),
            Some("10.1.1.64/26"),
            "host bits of the range ignored"
        );
    }

    #[test]
    fn bad_ranges_are_refused_by_name() {
        for (range, mask) in [
            ("10.0.0.0", 24),
            ("fd00::/64", 80),
            ("10.0.0.0/33", 24),
            ("10.0.0.0/16", 8),
            ("10.0.0.0/16", 31),
        ] {
            let e = NodeCidrs::new(range, mask).unwrap_err();
            assert!(e.to_string().starts_with("--node-pod-cidrs"), "{e}");
        }
    }
}
