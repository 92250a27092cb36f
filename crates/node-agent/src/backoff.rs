//! Jittered exponential backoff.
//!
//! This module owns every "how long do I wait" decision of the agent, so that the numbers live in one place and
//! are unit-tested with paused tokio time:
//!
//! * [`BackoffPolicy`] — the shape of a retry schedule (initial delay, cap, factor, jitter, reset-after), built
//!   through a checked constructor. Presets carry the kubelet's numbers: [`BackoffPolicy::registration`]
//!   (100 ms doubling to 7 s), [`BackoffPolicy::lease_retry`] (200 ms doubling to 7 s) and
//!   [`BackoffPolicy::crash_loop`] (10 s doubling to 300 s, forgotten after 10 minutes without a failure).
//! * [`Backoff`] — one retry sequence (a registration loop, a lease renewal loop).
//! * [`KeyedBackoff`] — one sequence per key (per container, for CrashLoopBackOff), with the kubelet's
//!   "in back-off since" query and garbage collection of idle keys.
//! * [`jittered`] and [`random_phase`] — spreading waits so that thousands of agents in one process do not act
//!   in lock-step (periodic loops: [`crate::density::periodic`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// Why a [`BackoffPolicy`] was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackoffError {
    /// The initial delay was zero.
    #[error("backoff initial delay must be greater than zero")]
    ZeroInitial,
    /// The cap was below the initial delay.
    #[error("backoff maximum {max:?} is below the initial delay {initial:?}")]
    MaxBelowInitial {
        /// The requested initial delay.
        initial: Duration,
        /// The requested cap.
        max: Duration,
    },
    /// The growth factor was below 1 or not a finite number.
    #[error("backoff factor must be a finite number >= 1, got {0}")]
    BadFactor(f64),
    /// The jitter fraction was outside `0.0..=1.0`.
    #[error("backoff jitter must be within 0.0..=1.0, got {0}")]
    BadJitter(f64),
}

/// The shape of a retry schedule: `initial`, then multiplied by `factor` after every failure up to `max`; each
/// delay is stretched by a random fraction in `[0, jitter)` of itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    initial: Duration,
    max: Duration,
    factor: f64,
    jitter: f64,
    reset_after: Option<Duration>,
}

impl BackoffPolicy {
    /// A doubling policy from `initial` to `max`, without jitter and without automatic reset.
    ///
    /// Refuses a zero `initial` and a `max` below `initial`.
    pub fn new(initial: Duration, max: Duration) -> Result<Self, BackoffError> {
        if initial.is_zero() {
            return Err(BackoffError::ZeroInitial);
        }
        if max < initial {
            return Err(BackoffError::MaxBelowInitial { initial, max });
        }
        Ok(Self {
            initial,
            max,
            factor: 2.0,
            jitter: 0.0,
            reset_after: None,
        })
    }

    /// A doubling policy known to be valid at compile time; a zero `initial`, a `max` below it or a jitter
    /// outside `0.0..=1.0` fails the build when used in a `const`.
    pub const fn const_new(initial: Duration, max: Duration, jitter: f64) -> Self {
        assert!(
            !initial.is_zero(),
            "backoff initial delay must be greater than zero"
        );
        assert!(
            max.as_nanos() >= initial.as_nanos(),
            "backoff maximum below the initial delay"
        );
        assert!(
            jitter >= 0.0 && jitter <= 1.0,
            "backoff jitter must be within 0.0..=1.0"
        );
        Self {
            initial,
            max,
            factor: 2.0,
            jitter,
            reset_after: None,
        }
    }

    /// The same policy growing by `factor` (>= 1) instead of doubling.
    pub fn with_factor(mut self, factor: f64) -> Result<Self, BackoffError> {
        if !factor.is_finite() || factor < 1.0 {
            return Err(BackoffError::BadFactor(factor));
        }
        self.factor = factor;
        Ok(self)
    }

    /// The same policy with every delay stretched by a random fraction in `[0, jitter)` of itself.
    pub fn with_jitter(mut self, jitter: f64) -> Result<Self, BackoffError> {
        if !(0.0..=1.0).contains(&jitter) {
            return Err(BackoffError::BadJitter(jitter));
        }
        self.jitter = jitter;
        Ok(self)
    }

    /// The same policy, starting over at `initial` once `after` has passed since the last failure.
    pub fn with_reset_after(mut self, after: Duration) -> Self {
        self.reset_after = Some(after);
        self
    }

    /// Node registration: 100 ms doubling to 7 s (the kubelet's schedule), 10 % jitter.
    pub fn registration() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(7),
            factor: 2.0,
            jitter: 0.1,
            reset_after: None,
        }
    }

    /// Lease renewal retries: 200 ms doubling to 7 s (the kubelet's lease controller), 10 % jitter.
    pub fn lease_retry() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(7),
            factor: 2.0,
            jitter: 0.1,
            reset_after: None,
        }
    }

    /// A broken list or watch: 800 ms doubling to 30 s, 10 % jitter (kube-runtime's default watcher back-off).
    pub fn watch_retry() -> Self {
        Self {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: 0.1,
            reset_after: None,
        }
    }

    /// Generic API write retries: 100 ms doubling to 7 s, 10 % jitter.
    pub fn api_retry() -> Self {
        Self::registration()
    }

    /// Container restarts (CrashLoopBackOff): 10 s doubling to 300 s, forgotten after 10 minutes without a
    /// failure, no jitter — the kubelet's values.
    pub fn crash_loop() -> Self {
        Self {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
            factor: 2.0,
            jitter: 0.0,
            reset_after: Some(Duration::from_secs(600)),
        }
    }

    /// The first delay.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The cap on the un-jittered delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The jitter fraction.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// After how long without failure the sequence starts over, if ever.
    pub fn reset_after(&self) -> Option<Duration> {
        self.reset_after
    }

    fn grow(&self, current: Duration) -> Duration {
        let grown = if self.factor.fract() == 0.0 && self.factor <= f64::from(u32::MAX) {
            // Integral factors (the usual doubling) stay exact.
            current.checked_mul(self.factor as u32)
        } else {
            Duration::try_from_secs_f64(current.as_secs_f64() * self.factor).ok()
        };
        grown.unwrap_or(self.max).min(self.max)
    }
}

/// Stretches `base` by a random fraction in `[0, factor)` of itself (`factor` <= 0 returns `base`).
pub fn jittered(base: Duration, factor: f64) -> Duration {
    if factor <= 0.0 || base.is_zero() {
        return base;
    }
    let extra: f64 = rand::random_range(0.0..factor);
    let stretch = Duration::try_from_secs_f64(base.as_secs_f64() * extra).unwrap_or(Duration::ZERO);
    base.saturating_add(stretch)
}

/// A uniformly random duration in `[0, max)`, used to spread the first tick of many agents.
pub fn random_phase(max: Duration) -> Duration {
    if max.is_zero() {
        return max;
    }
    Duration::try_from_secs_f64(max.as_secs_f64() * rand::random_range(0.0..1.0)).unwrap_or(Duration::ZERO)
}

/// One retry sequence.
///
/// ```
/// # use node_agent::backoff::{Backoff, BackoffPolicy};
/// # use std::time::Duration;
/// let policy = BackoffPolicy::new(Duration::from_millis(100), Duration::from_secs(7)).unwrap();
/// let mut b = Backoff::new(policy);
/// assert_eq!(b.next_delay(), Duration::from_millis(100));
/// assert_eq!(b.next_delay(), Duration::from_millis(200));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: BackoffPolicy,
    next_base: Duration,
    attempts: u32,
    last_failure: Option<Instant>,
}

impl Backoff {
    /// A fresh sequence following `policy`.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            next_base: policy.initial,
            policy,
            attempts: 0,
            last_failure: None,
        }
    }

    /// The sequence in `slot`, started with `policy` if there is none: for a long-lived task that mostly
    /// succeeds and keeps a back-off only while failing (`None` after a success), one pointer while idle.
    pub fn in_slot(slot: &mut Option<Box<Backoff>>, policy: BackoffPolicy) -> &mut Backoff {
        slot.get_or_insert_with(|| Box::new(Backoff::new(policy)))
    }

    /// The delay to wait after one more failure (jittered), advancing the sequence.
    pub fn next_delay(&mut self) -> Duration {
        let now = Instant::now();
        if let (Some(after), Some(last)) = (self.policy.reset_after, self.last_failure)
            && now.saturating_duration_since(last) >= after
        {
            self.reset();
        }
        let base = self.next_base;
        self.next_base = self.policy.grow(base);
        self.attempts = self.attempts.saturating_add(1);
        self.last_failure = Some(now);
        jittered(base, self.policy.jitter)
    }

    /// Waits for [`next_delay`](Self::next_delay).
    pub async fn wait(&mut self) {
        let d = self.next_delay();
        tokio::time::sleep(d).await;
    }

    /// Starts over at the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next_base = self.policy.initial;
        self.attempts = 0;
        self.last_failure = None;
    }

    /// How many failures since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The policy this sequence follows.
    pub fn policy(&self) -> &BackoffPolicy {
        &self.policy
    }
}

#[derive(Debug, Clone, Copy)]
struct KeyedEntry {
    delay: Duration,
    last_update: Instant,
}

/// One retry sequence per key, like the kubelet's per-container restart backoff.
///
/// A key's delay starts at the policy's initial delay, grows on every [`next`](Self::next), and starts over
/// when the key has been quiet for the policy's reset-after (default: twice the cap, as the kubelet does).
#[derive(Debug, Clone)]
pub struct KeyedBackoff<K> {
    policy: BackoffPolicy,
    entries: HashMap<K, KeyedEntry>,
}

impl<K: Hash + Eq + Clone> KeyedBackoff<K> {
    /// An empty table following `policy`.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            entries: HashMap::new(),
        }
    }

    fn expiry(&self) -> Duration {
        self.policy.reset_after.unwrap_or(self.policy.max * 2)
    }

    /// Records a failure of `key` at `now` and returns the delay before the next attempt (jittered).
    pub fn next(&mut self, key: &K, now: Instant) -> Duration {
        let expiry = self.expiry();
        let delay = match self.entries.get(key) {
            Some(e) if now.saturating_duration_since(e.last_update) <= expiry => self.policy.grow(e.delay),
            _ => self.policy.initial,
        };
        self.entries.insert(
            key.clone(),
            KeyedEntry {
                delay,
                last_update: now,
            },
        );
        jittered(delay, self.policy.jitter)
    }

    /// The current (un-jittered) delay of `key`, if it has one.
    pub fn current(&self, key: &K) -> Option<Duration> {
        self.entries.get(key).map(|e| e.delay)
    }

    /// Whether `key` is still waiting at `now`: its last failure was less than its delay ago (and not so long ago
    /// that the key expired).
    pub fn in_backoff_since(&self, key: &K, now: Instant) -> bool {
        match self.entries.get(key) {
            Some(e) => {
                let since = now.saturating_duration_since(e.last_update);
                since <= self.expiry() && since < e.delay
            }
            None => false,
        }
    }

    /// Forgets `key`.
    pub fn reset(&mut self, key: &K) {
        self.entries.remove(key);
    }

    /// Drops keys quiet for longer than the reset-after period.
    pub fn gc(&mut self, now: Instant) {
        let expiry = self.expiry();
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.last_update) <= expiry);
    }

    /// Number of keys with a live sequence.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key has a live sequence.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn checked_constructor_refuses_bad_shapes() {
        assert_eq!(
            BackoffPolicy::new(Duration::ZERO, ms(10)),
            Err(BackoffError::ZeroInitial)
        );
        assert!(matches!(
            BackoffPolicy::new(ms(10), ms(5)),
            Err(BackoffError::MaxBelowInitial { .. })
        ));
        let p = BackoffPolicy::new(ms(10), ms(50)).unwrap();
        assert!(matches!(p.with_factor(0.5), Err(BackoffError::BadFactor(_))));
        assert!(matches!(p.with_factor(f64::NAN), Err(BackoffError::BadFactor(_))));
        assert!(matches!(p.with_jitter(1.5), Err(BackoffError::BadJitter(_))));
        assert!(matches!(p.with_jitter(-0.1), Err(BackoffError::BadJitter(_))));
        assert!(p.with_jitter(0.0).is_ok());
    }

    #[test]
    fn registration_schedule_is_100ms_doubling_to_7s() {
        let policy = BackoffPolicy::registration().with_jitter(0.0).unwrap();
        let mut b = Backoff::new(policy);
        let got: Vec<u64> = (0..9).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1600, 3200, 6400, 7000, 7000]);
        assert_eq!(b.attempts(), 9);
        b.reset();
        assert_eq!(b.next_delay(), ms(100));
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let mut b = Backoff::new(BackoffPolicy::registration());
        for expected in [100u64, 200, 400, 800, 1600, 3200, 6400, 7000, 7000, 7000] {
            let d = b.next_delay();
            assert!(d >= ms(expected), "{d:?} below {expected}ms");
            assert!(
                d < ms(expected) + ms(expected).mul_f64(0.1),
                "{d:?} above {expected}ms + 10%"
            );
        }
        for _ in 0..1000 {
            let d = jittered(Duration::from_secs(10), 0.04);
            assert!(d >= Duration::from_secs(10) && d < Duration::from_millis(10_400));
        }
        assert_eq!(jittered(Duration::from_secs(1), 0.0), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn crash_loop_resets_after_ten_quiet_minutes() {
        let mut b = Backoff::new(BackoffPolicy::crash_loop());
        let seq: Vec<u64> = (0..7).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(seq, vec![10, 20, 40, 80, 160, 300, 300]);
        tokio::time::advance(Duration::from_secs(599)).await;
        assert_eq!(b.next_delay(), Duration::from_secs(300));
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(b.next_delay(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn keyed_backoff_tracks_each_key() {
        let mut kb: KeyedBackoff<&str> = KeyedBackoff::new(BackoffPolicy::crash_loop());
        let t0 = Instant::now();
        assert_eq!(kb.next(&"a", t0), Duration::from_secs(10));
        assert_eq!(kb.next(&"a", t0), Duration::from_secs(20));
        assert_eq!(kb.next(&"b", t0), Duration::from_secs(10));
        assert!(kb.in_backoff_since(&"a", t0 + Duration::from_secs(19)));
        assert!(!kb.in_backoff_since(&"a", t0 + Duration::from_secs(20)));
        assert!(!kb.in_backoff_since(&"zzz", t0));
        // Quiet for longer than 10 minutes: starts over.
        let later = t0 + Duration::from_secs(601);
        assert_eq!(kb.next(&"a", later), Duration::from_secs(10));
        kb.gc(later);
        assert_eq!(kb.len(), 1, "b expired");
        kb.reset(&"a");
        assert!(kb.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_wait_sleeps_the_delay() {
        let mut b = Backoff::new(BackoffPolicy::new(ms(100), ms(400)).unwrap());
        let t0 = Instant::now();
        b.wait().await;
        b.wait().await;
        b.wait().await;
        b.wait().await;
        assert_eq!(Instant::now() - t0, ms(100 + 200 + 400 + 400));
    }
}
