//! Pod IP allocation from the node's pod CIDR(s): round-robin over the host addresses of each range (the
//! network address, the gateway `.1` and the IPv4 broadcast address are never handed out), like the host-local
//! IPAM plugin a real node uses. Dual-stack: one address from each configured range.

use std::net::IpAddr;

/// A CIDR that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid pod CIDR {cidr:?}: {reason}")]
pub struct CidrError {
    /// The CIDR as given.
    pub cidr: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

#[derive(Debug)]
struct Range {
    base: u128,
    v6: bool,
    /// Host offsets handed out: `first..=last`.
    first: u128,
    last: u128,
    cursor: u128,
    used: Offsets,
}

/// The host offsets in use, sorted, in a vector grown one entry at a time: a node runs a few pods to a hundred,
/// and a `BTreeSet` allocates a whole node for its first.
#[derive(Debug, Default)]
struct Offsets(Vec<u128>);

impl Offsets {
    fn len(&self) -> usize {
        self.0.len()
    }

    /// Adds `offset`; `false` if it was in use already.
    fn insert(&mut self, offset: u128) -> bool {
        match self.0.binary_search(&offset) {
            Ok(_) => false,
            Err(at) => {
                self.0.reserve_exact(1);
                self.0.insert(at, offset);
                true
            }
        }
    }

    fn remove(&mut self, offset: &u128) {
        if let Ok(at) = self.0.binary_search(offset) {
            self.0.remove(at);
        }
    }
}

impl Range {
    fn parse(text: &str) -> Result<Range, CidrError> {
        let err = |reason| CidrError {
            cidr: text.to_owned(),
            reason,
        };
        let (addr, bits) = text
            .trim()
            .split_once('/')
            .ok_or_else(|| err("expected address/prefix"))?;
        let addr: IpAddr = addr.parse().map_err(|_| err("bad address"))?;
        let bits: u32 = bits.parse().map_err(|_| err("bad prefix length"))?;
        let (value, width, v6) = match addr {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32, false),
            IpAddr::V6(a) => (u128::from(a), 128, true),
        };
        if bits > width {
            return Err(err("prefix length too long"));
        }
        let host_bits = width - bits;
        if host_bits < 2 {
            return Err(err("range too small for pods"));
        }
        let size = if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        let base = value & !size;
        // skip the network address and the gateway; IPv4 also keeps its broadcast address
        let last = if v6 { size } else { size - 1 };
        Ok(Range {
            base,
            v6,
            first: 2,
            last,
            cursor: 1,
            used: Offsets::default(),
        })
    }

    fn addr(&self, offset: u128) -> IpAddr {
        let value = self.base + offset;
        if self.v6 {
            IpAddr::V6(value.into())
        } else {
            IpAddr::V4((value as u32).into())
        }
    }

    fn offset_of(&self, ip: IpAddr) -> Option<u128> {
        let value = match ip {
            IpAddr::V4(a) if !self.v6 => u128::from(u32::from(a)),
            IpAddr::V6(a) if self.v6 => u128::from(a),
            _ => return None,
        };
        value
            .checked_sub(self.base)
            .filter(|o| (self.first..=self.last).contains(o))
    }

    fn allocate(&mut self) -> Option<IpAddr> {
        let span = self.last - self.first + 1;
        if self.used.len() as u128 >= span {
            return None;
        }
        let mut offset = self.cursor;
        loop {
            offset = if offset >= self.last {
                self.first
            } else {
                offset + 1
            };
            if self.used.insert(offset) {
                self.cursor = offset;
                return Some(self.addr(offset));
            }
        }
    }
}

/// The pod address allocator of one fake runtime.
#[derive(Debug)]
pub(crate) struct Ipam {
    ranges: Box<[Range]>,
    text: Box<str>,
}

impl Ipam {
    /// Ranges from a comma-separated CIDR list (`10.244.1.0/24` or `10.244.1.0/24,fd00:1::/64`).
    pub(crate) fn new(cidrs: &str) -> Result<Ipam, CidrError> {
        let ranges = cidrs
            .split(',')
            .filter(|c| !c.trim().is_empty())
            .map(Range::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if ranges.is_empty() {
            return Err(CidrError {
                cidr: cidrs.to_owned(),
                reason: "no range given",
            });
        }
        Ok(Ipam {
            ranges: ranges.into(),
            text: cidrs.trim().into(),
        })
    }

    /// The default range, 10.88.0.0/16 (`crate::DEFAULT_POD_CIDR`).
    pub(crate) fn fallback() -> Ipam {
        let base = u128::from(u32::from(std::net::Ipv4Addr::new(10, 88, 0, 0)));
        let range = Range {
            base,
            v6: false,
            first: 2,
            last: 0xfffe,
            cursor: 1,
            used: Offsets::default(),
        };
        Ipam {
            ranges: Box::new([range]),
            text: "10.88.0.0/16".into(),
        }
    }

    /// The CIDRs as configured.
    pub(crate) fn cidrs(&self) -> &str {
        &self.text
    }

    /// One address from every range (primary first), or `None` when a range is exhausted.
    pub(crate) fn allocate(&mut self) -> Option<Vec<IpAddr>> {
        let mut ips = Vec::with_capacity(self.ranges.len());
        for i in 0..self.ranges.len() {
            match self.ranges[i].allocate() {
                Some(ip) => ips.push(ip),
                None => {
                    self.release(&ips);
                    return None;
                }
            }
        }
        Some(ips)
    }

    /// Give addresses back (ignores addresses outside the current ranges, e.g. after a CIDR change).
    pub(crate) fn release(&mut self, ips: &[IpAddr]) {
        for ip in ips {
            for range in &mut self.ranges {
                if let Some(offset) = range.offset_of(*ip) {
                    range.used.remove(&offset);
                }
            }
        }
    }

    /// Mark addresses still held by sandboxes as used (after the ranges changed).
    pub(crate) fn reserve(&mut self, ips: &[IpAddr]) {
        for ip in ips {
            for range in &mut self.ranges {
                if let Some(offset) = range.offset_of(*ip) {
                    range.used.insert(offset);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_host_addresses_round_robin() {
        let mut ipam = Ipam::new("10.244.1.0/29").unwrap();
        let got: Vec<String> = (0..5).map(|_| ipam.allocate().unwrap()[0].to_string()).collect();
        assert_eq!(
            got,
            [
                "10.244.1.2",
                "10.244.1.3",
                "10.244.1.4",
                "10.244.1.5",
                "10.244.1.6"
            ]
        );
        assert_eq!(ipam.allocate(), None, ".7 is the broadcast address");
        ipam.release(&["10.244.1.4".parse().unwrap()]);
        assert_eq!(ipam.allocate().unwrap()[0].to_string(), "10.244.1.4");
    }

    #[test]
    fn dual_stack_and_errors() {
        let mut ipam = Ipam::new("10.1.0.0/24,fd00:10::/120").unwrap();
        let ips = ipam.allocate().unwrap();
        assert_eq!(ips.len(), 2);
        assert_eq!(ips[0].to_string(), "10.1.0.2");
        assert_eq!(ips[1].to_string(), "fd00:10::2");
        assert_eq!(
            Ipam::new("10.1.0.3/24").unwrap().allocate().unwrap()[0].to_string(),
            "10.1.0.2"
        );
        for bad in ["", "10.0.0.0", "10.0.0.0/33", "10.0.0.0/31", "x/8"] {
            assert!(Ipam::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fallback_is_the_default_cidr() {
        let mut fallback = Ipam::fallback();
        let mut parsed = Ipam::new(crate::DEFAULT_POD_CIDR).unwrap();
        assert_eq!(fallback.cidrs(), crate::DEFAULT_POD_CIDR);
        assert_eq!(fallback.allocate(), parsed.allocate());
        assert_eq!(fallback.ranges[0].last, parsed.ranges[0].last);
    }

    #[test]
    fn reserve_keeps_addresses_of_live_pods() {
        let mut ipam = Ipam::new("10.0.0.0/30").unwrap();
        ipam.reserve(&["10.0.0.2".parse().unwrap()]);
        assert_eq!(ipam.allocate(), None, "/30 has one pod address and it is taken");
    }
}
