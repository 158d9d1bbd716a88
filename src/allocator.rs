//! Pure reference model of the per-shard ULID allocator (ARCHITECTURE.md, "ULIDs and the
//! allocator").
//!
//! The server allocates ULIDs in T-SQL; this module carries the same arithmetic
//! without a server so that it can be property-tested and so that the server's
//! output can be checked against it bit for bit.
//!
//! Layout of every ULID issued (16 bytes, compared byte-wise):
//!
//! | bytes | content |
//! |---|---|
//! | 0–5 | milliseconds since 1970-01-01 UTC, big-endian |
//! | 6–7 | `random16`, drawn when the shard starts a new millisecond |
//! | 8–15 | counter, big-endian two's complement `i64` |
//!
//! A fresh counter starts at a random value with bit 62 cleared, so that adding
//! up to 2^62 never overflows and never changes the sign. The sign matters:
//! in byte order a negative counter sorts *after* every non-negative one, so a
//! counter that crossed from -1 to 0 would make ULIDs go backwards.
//!
//! One piece: the allocator is one model, whose ULID layout, random parts and batch rules
//! are checked against each other (540 lines of code, the rest its unit tests), and the
//! released, frozen migrations V3, V15, V42 and V56 cite it as `src/allocator.rs`, a path
//! that a split into a folder would break.

use ulid::Ulid;

/// Largest time hint the allocator uses: 9999-12-31T23:59:59.999Z, the
/// largest `datetime2(3)`, so hints the server cannot represent are clamped
/// the same way on both sides. It is below 2^48, so it always fits bytes 0–5.
pub const MAX_MS: i64 = 253_402_300_799_999;
const _: () = assert!(MAX_MS < 1 << 48);

/// How far a time hint may be ahead of the server's clock when the server
/// allocates (`read_feed` moving outbox rows, `lock_feed`): a later hint counts
/// as `now + HINT_TOLERANCE_MS`. One wrong hint (a skewed client clock, year
/// 9999) would otherwise move the shard's clock ahead for good, since ULID time
/// never goes back. The SQL templates use the same 1000 ms.
pub const HINT_TOLERANCE_MS: i64 = 1_000;

/// Mask applied to a raw random counter start: bit 62 cleared, which leaves
/// 2^62 additions of headroom before the counter could overflow or change sign.
pub const COUNTER_MASK: i64 = !(1 << 62);

/// Counters reserved by one serialized-writer `lock_feed` call: large enough
/// for any single transaction, small enough that 2^62 / 10^11 ≈ 4.6·10^7
/// reservations fit under one high part.
pub const RESERVATION_SIZE: i64 = 100_000_000_000;

/// Turns a raw random `i64` into a counter start with the full 2^62 headroom.
///
/// ```
/// use changefeed::allocator::mask_counter;
/// assert_eq!(mask_counter(-1), 0xBFFF_FFFF_FFFF_FFFFu64 as i64);
/// assert_eq!(mask_counter(0x3FFF_FFFF_FFFF_FFFF), 0x3FFF_FFFF_FFFF_FFFF);
/// ```
pub const fn mask_counter(raw: i64) -> i64 {
    raw & COUNTER_MASK
}

/// The latest millisecond a hint may carry when the server's clock reads
/// `now_ms`: `now_ms + HINT_TOLERANCE_MS`, kept within `0 ..= MAX_MS`.
///
/// ```
/// use changefeed::allocator::{latest_ms, HINT_TOLERANCE_MS, MAX_MS};
/// assert_eq!(latest_ms(1_000), 1_000 + HINT_TOLERANCE_MS);
/// assert_eq!(latest_ms(i64::MAX), MAX_MS);
/// assert_eq!(latest_ms(i64::MIN), 0);
/// ```
pub const fn latest_ms(now_ms: i64) -> i64 {
    let latest = now_ms.saturating_add(HINT_TOLERANCE_MS);
    if latest < 0 {
        0
    } else if latest > MAX_MS {
        MAX_MS
    } else {
        latest
    }
}

/// Clamps a time hint to `0 ..= latest_ms(now_ms)`: a pre-1970 hint counts as
/// 1970, and one later than the server's clock plus [`HINT_TOLERANCE_MS`]
/// counts as that instant. (Hints earlier than the shard's last millisecond
/// are not clamped here: the allocator continues that millisecond.)
///
/// ```
/// use changefeed::allocator::{clamp_hint, HINT_TOLERANCE_MS};
/// let now = 1_672_671_845_000;
/// assert_eq!(clamp_hint(-5, now), 0);
/// assert_eq!(clamp_hint(i64::MAX, now), now + HINT_TOLERANCE_MS);
/// assert_eq!(clamp_hint(now + 10, now), now + 10);
/// assert_eq!(clamp_hint(now - 10, now), now - 10);
/// ```
pub const fn clamp_hint(hint_ms: i64, now_ms: i64) -> i64 {
    let latest = latest_ms(now_ms);
    if hint_ms < 0 {
        0
    } else if hint_ms > latest {
        latest
    } else {
        hint_ms
    }
}

/// The 8-byte high part `ms(6 bytes, BE) ‖ random16(BE)`.
fn high_part(ms: i64, random16: u16) -> [u8; 8] {
    assert!(
        (0..1 << 48).contains(&ms),
        "millisecond {ms} does not fit the 48-bit ULID time field"
    );
    let mut high = [0u8; 8];
    high[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    high[6..].copy_from_slice(&random16.to_be_bytes());
    high
}

fn ulid_from_high(high: [u8; 8], counter: i64) -> Ulid {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&high);
    bytes[8..].copy_from_slice(&counter.to_be_bytes());
    Ulid::from_bytes(bytes)
}

/// Builds a ULID from its three fields, exactly as the server lays them out.
///
/// # Panics
///
/// If `ms` is negative or does not fit in 48 bits.
///
/// ```
/// use changefeed::allocator::{ulid_counter, ulid_from_parts, ulid_ms, ulid_random16};
/// let u = ulid_from_parts(1_672_671_845_000, 0xFFFF, -42);
/// assert_eq!(ulid_ms(u), 1_672_671_845_000);
/// assert_eq!(ulid_random16(u), 0xFFFF);
/// assert_eq!(ulid_counter(u), -42);
/// ```
pub fn ulid_from_parts(ms: i64, random16: u16, counter: i64) -> Ulid {
    ulid_from_high(high_part(ms, random16), counter)
}

/// Milliseconds since the epoch held in bytes 0–5.
pub fn ulid_ms(u: Ulid) -> i64 {
    let b = u.to_bytes();
    let mut ms = [0u8; 8];
    ms[2..].copy_from_slice(&b[..6]);
    i64::from_be_bytes(ms)
}

/// The `random16` held in bytes 6–7.
pub fn ulid_random16(u: Ulid) -> u16 {
    let b = u.to_bytes();
    u16::from_be_bytes([b[6], b[7]])
}

/// The high part (bytes 0–7): all ULIDs sharing it come from one counter run.
pub fn ulid_high(u: Ulid) -> [u8; 8] {
    let b = u.to_bytes();
    let mut high = [0u8; 8];
    high.copy_from_slice(&b[..8]);
    high
}

/// The signed counter held in bytes 8–15.
pub fn ulid_counter(u: Ulid) -> i64 {
    let b = u.to_bytes();
    let mut c = [0u8; 8];
    c.copy_from_slice(&b[8..]);
    i64::from_be_bytes(c)
}

/// The per-shard state row: what the next allocation continues from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShardState {
    /// Last millisecond used; later hints start a new high, others continue.
    pub last_ms: i64,
    /// `ms(last_ms) ‖ random16` of the current counter run.
    pub high: [u8; 8],
    /// First counter value not yet issued under `high`.
    pub next_counter: i64,
}

/// Source of the random parts: lets tests feed fixed values and the property
/// tests compare the row-by-row rule with the set-based one.
pub trait RandomParts {
    /// Random bytes 6–7 for a new millisecond.
    fn random16(&mut self) -> u16;
    /// A fresh counter start, already masked with [`COUNTER_MASK`].
    fn counter_start(&mut self) -> i64;
}

/// Operating-system randomness (via `rand`), as used in production.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsRandom;

impl RandomParts for OsRandom {
    fn random16(&mut self) -> u16 {
        rand::random()
    }

    fn counter_start(&mut self) -> i64 {
        mask_counter(rand::random())
    }
}

/// Returns the same values on every draw, which is what the server's
/// set-based allocation amounts to within one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedRandom {
    /// Returned by every [`RandomParts::random16`] call.
    pub random16: u16,
    /// Returned, masked, by every [`RandomParts::counter_start`] call.
    pub counter_start: i64,
}

impl FixedRandom {
    /// Takes the raw counter draw and masks it, as the server does.
    pub const fn new(random16: u16, raw_counter_start: i64) -> Self {
        Self {
            random16,
            counter_start: mask_counter(raw_counter_start),
        }
    }
}

impl RandomParts for FixedRandom {
    fn random16(&mut self) -> u16 {
        self.random16
    }

    fn counter_start(&mut self) -> i64 {
        // Masked again because the field is public and could hold a raw draw.
        mask_counter(self.counter_start)
    }
}

/// Issues `count` consecutive counters starting at `first` and returns the
/// counter after the last one.
///
/// `continues` says `first` follows a counter already issued under the same
/// high (`first - 1`); that predecessor must then be on the same side of zero.
///
/// Panics when the run would overflow or change sign: that is more than 2^62
/// counters under one high, which the masked start rules out in practice, and
/// the server would otherwise hand out ULIDs that sort backwards.
fn issue_run(first: i64, count: i64, continues: bool) -> i64 {
    assert!(count >= 1, "a counter run issues at least one value");
    let last = first
        .checked_add(count - 1)
        .expect("ULID counter headroom exhausted: counter overflows i64");
    let lowest = if continues {
        first.checked_sub(1).unwrap_or(first)
    } else {
        first
    };
    assert!(
        (lowest < 0) == (last < 0),
        "ULID counter headroom exhausted: counter would change sign under one high"
    );
    last.checked_add(1)
        .expect("ULID counter headroom exhausted: next counter overflows i64")
}

/// Clamps the hints of a batch ([`clamp_hint`]) and makes them non-decreasing,
/// in batch order.
fn lift(hints_ms: &[i64], now_ms: i64) -> impl Iterator<Item = i64> + '_ {
    hints_ms.iter().scan(0i64, move |running, &hint| {
        // 0 is the identity here because clamped hints are never negative.
        *running = (*running).max(clamp_hint(hint, now_ms));
        Some(*running)
    })
}

/// A run of counters reserved under one high by [`Allocator::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UlidRange {
    high: [u8; 8],
    first_counter: i64,
    len: i64,
}

impl UlidRange {
    /// The range the server's `lock_feed` reserved: `len` counters from `first_counter`
    /// under `high`. Returns `None` when the range would run past the counter's headroom
    /// (it would not be strictly increasing), which a server-made range never does.
    pub fn from_parts(high: [u8; 8], first_counter: i64, len: i64) -> Option<UlidRange> {
        let last = first_counter.checked_add(len.checked_sub(1)?)?;
        // Crossing from -1 to 0 would sort backwards in byte order.
        if len < 1 || (first_counter < 0 && last >= 0) {
            return None;
        }
        Some(UlidRange {
            high,
            first_counter,
            len,
        })
    }

    /// The first ULID of the range, the one `lock_feed` returns.
    pub fn first(&self) -> Ulid {
        ulid_from_high(self.high, self.first_counter)
    }

    /// The `i`-th ULID (1-based, as the server numbers them), or `None`
    /// outside `1..=len`.
    pub fn nth(&self, i: i64) -> Option<Ulid> {
        if (1..=self.len).contains(&i) {
            // Cannot overflow: the whole range was issued by `issue_run`.
            Some(ulid_from_high(self.high, self.first_counter + (i - 1)))
        } else {
            None
        }
    }

    /// The last ULID of the range.
    pub fn last(&self) -> Ulid {
        ulid_from_high(self.high, self.first_counter + (self.len - 1))
    }

    /// Number of ULIDs reserved.
    pub fn len(&self) -> i64 {
        self.len
    }

    /// Always `false`: a reservation holds at least one ULID.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes 0–7 shared by every ULID of the range.
    pub fn high(&self) -> [u8; 8] {
        self.high
    }

    /// Counter of the first ULID.
    pub fn first_counter(&self) -> i64 {
        self.first_counter
    }
}

/// The allocator of one shard: its optional state row plus the rules that
/// issue strictly increasing ULIDs from it.
///
/// ```
/// use changefeed::allocator::{Allocator, FixedRandom, ulid_counter, ulid_ms};
///
/// let now = 1_672_671_845_000; // the server's clock when the rows move
/// let mut shard = Allocator::new();
/// let mut random = FixedRandom::new(0xFFFF, -1);
/// // Time hints may go backwards; ULIDs never do.
/// let ulids = shard.allocate(now, &[1_672_671_845_000, 1_672_671_844_000], &mut random);
/// assert_eq!(ulids[0].to_string(), "01GNSG5PM8ZZZVZZZZZZZZZZZZ");
/// assert!(ulids[0] < ulids[1]);
/// assert_eq!(ulid_ms(ulids[1]), 1_672_671_845_000);
/// assert_eq!(ulid_counter(ulids[1]), ulid_counter(ulids[0]) + 1);
///
/// // The server's set-based rule gives the same ULIDs for the same draws.
/// let mut server = Allocator::new();
/// assert_eq!(
///     server.allocate_set_based(now, &[1_672_671_845_000, 1_672_671_844_000], 0xFFFF, -1),
///     ulids
/// );
/// assert_eq!(server.state(), shard.state());
///
/// // A hint far ahead of the server's clock counts as the clock plus the tolerance.
/// let far = shard.allocate(now, &[i64::MAX], &mut random);
/// assert_eq!(ulid_ms(far[0]), now + changefeed::allocator::HINT_TOLERANCE_MS);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allocator {
    state: Option<ShardState>,
}

impl Allocator {
    /// A shard that has no state row yet.
    pub fn new() -> Self {
        Self { state: None }
    }

    /// A shard resuming from a stored state row.
    pub fn with_state(state: ShardState) -> Self {
        Self { state: Some(state) }
    }

    /// The state row as it would be stored now (`None` until the first ULID).
    pub fn state(&self) -> Option<ShardState> {
        self.state
    }

    /// Applies the rule to one lifted millisecond and issues `count` counters;
    /// returns the high and the first counter issued.
    fn issue(&mut self, ms: i64, count: i64, random: &mut impl RandomParts) -> ([u8; 8], i64) {
        let (state, first) = match self.state {
            Some(s) if ms <= s.last_ms => {
                let first = s.next_counter;
                let next_counter = issue_run(first, count, true);
                (ShardState { next_counter, ..s }, first)
            }
            _ => {
                let high = high_part(ms, random.random16());
                // Masked again so that a careless source cannot eat the headroom.
                let first = mask_counter(random.counter_start());
                let next_counter = issue_run(first, count, false);
                (
                    ShardState {
                        last_ms: ms,
                        high,
                        next_counter,
                    },
                    first,
                )
            }
        };
        self.state = Some(state);
        (state.high, first)
    }

    /// Allocates one ULID per row with the row-by-row rule of §4.3, drawing
    /// fresh random parts for every new millisecond. `now_ms` is the server's
    /// clock when the rows move: hints are clamped with [`clamp_hint`].
    ///
    /// # Panics
    ///
    /// If more than 2^62 counters would be issued under one high.
    pub fn allocate(
        &mut self,
        now_ms: i64,
        hints_ms: &[i64],
        random: &mut impl RandomParts,
    ) -> Vec<Ulid> {
        lift(hints_ms, now_ms)
            .map(|ms| {
                let (high, counter) = self.issue(ms, 1, random);
                ulid_from_high(high, counter)
            })
            .collect()
    }

    /// Allocates one ULID per row the way the server does it in one
    /// statement: one `random16` and one raw counter start (masked here) for
    /// the whole batch, shared by every new millisecond in it.
    ///
    /// Gives the same ULIDs and state as [`Allocator::allocate`] with
    /// `FixedRandom::new(random16, counter_start)`.
    ///
    /// # Panics
    ///
    /// If more than 2^62 counters would be issued under one high.
    pub fn allocate_set_based(
        &mut self,
        now_ms: i64,
        hints_ms: &[i64],
        random16: u16,
        counter_start: i64,
    ) -> Vec<Ulid> {
        if hints_ms.is_empty() {
            return Vec::new();
        }
        let counter_start = mask_counter(counter_start);
        let lifted: Vec<i64> = lift(hints_ms, now_ms).collect();

        // Rows at or before the state's millisecond are a prefix, because the
        // lifted hints are non-decreasing; they continue the state's run.
        let continuing = match self.state {
            Some(s) => {
                let n = lifted.partition_point(|&ms| ms <= s.last_ms);
                if n > 0 {
                    issue_run(s.next_counter, n as i64, true);
                }
                n
            }
            None => 0,
        };

        // Check the headroom of every new-millisecond group before issuing.
        let mut i = continuing;
        while i < lifted.len() {
            let end = lifted.partition_point(|&x| x <= lifted[i]);
            issue_run(counter_start, (end - i) as i64, false);
            i = end;
        }

        let ulids: Vec<Ulid> = lifted
            .iter()
            .enumerate()
            .map(|(i, &ms)| match self.state {
                Some(s) if i < continuing => ulid_from_high(s.high, s.next_counter + i as i64),
                _ => {
                    // row_number() over (partition by ms order by seq) - 1
                    let j = (i - lifted.partition_point(|&x| x < ms)) as i64;
                    ulid_from_parts(ms, random16, counter_start + j)
                }
            })
            .collect();

        let last = *ulids.last().expect("batch is not empty");
        let last_lifted = *lifted.last().expect("batch is not empty");
        self.state = Some(ShardState {
            last_ms: self
                .state
                .map_or(last_lifted, |s| s.last_ms.max(last_lifted)),
            high: ulid_high(last),
            next_counter: ulid_counter(last)
                .checked_add(1)
                .expect("ULID counter headroom exhausted: next counter overflows i64"),
        });
        ulids
    }

    /// Reserves `count` consecutive ULIDs for a serialized writer: the same
    /// rule as one row (the hint clamped with [`clamp_hint`] against the
    /// server's clock `now_ms`), but the counter advances by `count` (the
    /// server uses [`RESERVATION_SIZE`]), so the writer can number its own
    /// events.
    ///
    /// # Panics
    ///
    /// If `count < 1`, or if more than 2^62 counters would be issued under
    /// one high.
    ///
    /// ```
    /// use changefeed::allocator::{Allocator, OsRandom, RESERVATION_SIZE, ulid_counter};
    /// let mut shard = Allocator::new();
    /// let a = shard.reserve(5_000, 1_000, RESERVATION_SIZE, &mut OsRandom);
    /// let b = shard.reserve(5_000, 1_000, RESERVATION_SIZE, &mut OsRandom);
    /// assert_eq!(ulid_counter(b.first()), ulid_counter(a.first()) + RESERVATION_SIZE);
    /// assert!(a.nth(RESERVATION_SIZE).unwrap() < b.first());
    /// ```
    pub fn reserve(
        &mut self,
        now_ms: i64,
        hint_ms: i64,
        count: i64,
        random: &mut impl RandomParts,
    ) -> UlidRange {
        assert!(count >= 1, "a reservation holds at least one ULID");
        let (high, first_counter) = self.issue(clamp_hint(hint_ms, now_ms), count, random);
        UlidRange {
            high,
            first_counter,
            len: count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_672_671_845_000; // 2023-01-02T15:04:05Z
    /// The server's clock in these tests: a minute after T, so hints near T are not clamped.
    const NOW: i64 = T + 60_000;

    #[test]
    fn max_ms_is_the_largest_datetime2_3() {
        let max = time::macros::datetime!(9999-12-31 23:59:59.999 UTC);
        assert_eq!((max.unix_timestamp_nanos() / 1_000_000) as i64, MAX_MS);
    }

    #[test]
    fn mask_clears_only_bit_62() {
        assert_eq!(COUNTER_MASK, 0xBFFF_FFFF_FFFF_FFFFu64 as i64);
        assert_eq!(mask_counter(-1), COUNTER_MASK);
        assert_eq!(mask_counter(i64::MIN), i64::MIN);
        assert_eq!(mask_counter(i64::MAX), 0x3FFF_FFFF_FFFF_FFFF);
        assert_eq!(mask_counter(5), 5);
    }

    #[test]
    fn clamp_bounds() {
        assert_eq!(clamp_hint(i64::MIN, NOW), 0);
        assert_eq!(clamp_hint(-1, NOW), 0);
        assert_eq!(clamp_hint(0, NOW), 0);
        assert_eq!(
            clamp_hint(NOW + HINT_TOLERANCE_MS, NOW),
            NOW + HINT_TOLERANCE_MS
        );
        assert_eq!(
            clamp_hint(NOW + HINT_TOLERANCE_MS + 1, NOW),
            NOW + HINT_TOLERANCE_MS
        );
        assert_eq!(clamp_hint(MAX_MS, NOW), NOW + HINT_TOLERANCE_MS);
        assert_eq!(clamp_hint(i64::MAX, NOW), NOW + HINT_TOLERANCE_MS);
        // A clock at the end of datetime2 still yields a representable millisecond.
        assert_eq!(clamp_hint(i64::MAX, MAX_MS), MAX_MS);
        assert_eq!(clamp_hint(i64::MAX, i64::MAX), MAX_MS);
        assert_eq!(clamp_hint(5, i64::MIN), 0);
    }

    #[test]
    fn parts_round_trip_and_byte_layout() {
        let u = ulid_from_parts(0x0102_0304_0506, 0x0708, 0x090A_0B0C_0D0E_0F10);
        assert_eq!(
            u.to_bytes(),
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        );
        assert_eq!(ulid_ms(u), 0x0102_0304_0506);
        assert_eq!(ulid_random16(u), 0x0708);
        assert_eq!(ulid_counter(u), 0x090A_0B0C_0D0E_0F10);
        assert_eq!(ulid_high(u), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(ulid_ms(ulid_from_parts(MAX_MS, 0, 0)), MAX_MS);
    }

    #[test]
    #[should_panic(expected = "48-bit")]
    fn parts_reject_ms_beyond_48_bits() {
        ulid_from_parts(1 << 48, 0, 0);
    }

    #[test]
    fn carry_vector() {
        let mut shard = Allocator::new();
        let ulids = shard.allocate(NOW, &[T; 101], &mut FixedRandom::new(0xFFFF, -1));
        assert_eq!(ulids[0].to_string(), "01GNSG5PM8ZZZVZZZZZZZZZZZZ");
        assert_eq!(ulids[100].to_string(), "01GNSG5PM8ZZZW000000000033");
        assert_eq!(
            Ulid::from_string("01GNSG5PM8ZZZW000000000033").unwrap(),
            ulid_from_parts(T, 0xFFFF, COUNTER_MASK + 100)
        );
    }

    #[test]
    fn empty_batch_changes_nothing() {
        let mut fresh = Allocator::new();
        assert!(fresh.allocate(NOW, &[], &mut OsRandom).is_empty());
        assert!(fresh.allocate_set_based(NOW, &[], 1, 2).is_empty());
        assert_eq!(fresh.state(), None);

        let state = ShardState {
            last_ms: T,
            high: high_part(T, 9),
            next_counter: 77,
        };
        let mut shard = Allocator::with_state(state);
        assert!(shard.allocate(NOW, &[], &mut OsRandom).is_empty());
        assert!(shard.allocate_set_based(NOW, &[], 1, 2).is_empty());
        assert_eq!(shard.state(), Some(state));
    }

    #[test]
    fn fresh_shard_starts_a_new_high() {
        let mut shard = Allocator::new();
        let u = shard.allocate(NOW, &[T], &mut FixedRandom::new(0xABCD, 1000));
        assert_eq!(u, vec![ulid_from_parts(T, 0xABCD, 1000)]);
        assert_eq!(
            shard.state(),
            Some(ShardState {
                last_ms: T,
                high: high_part(T, 0xABCD),
                next_counter: 1001,
            })
        );
    }

    #[test]
    fn backwards_or_equal_time_continues_the_state() {
        let state = ShardState {
            last_ms: T,
            high: high_part(T, 0x1234),
            next_counter: -500,
        };
        let mut shard = Allocator::with_state(state);
        let u = shard.allocate(NOW, &[T - 10, T, -3], &mut FixedRandom::new(0, 0));
        assert_eq!(
            u,
            vec![
                ulid_from_parts(T, 0x1234, -500),
                ulid_from_parts(T, 0x1234, -499),
                ulid_from_parts(T, 0x1234, -498),
            ]
        );
        assert_eq!(shard.state().unwrap().next_counter, -497);
        assert_eq!(shard.state().unwrap().last_ms, T);
    }

    #[test]
    fn hints_are_lifted_within_a_batch() {
        let mut shard = Allocator::new();
        let u = shard.allocate(NOW, &[T, T - 5, T + 1, T], &mut FixedRandom::new(7, 40));
        assert_eq!(
            u,
            vec![
                ulid_from_parts(T, 7, 40),
                ulid_from_parts(T, 7, 41),
                ulid_from_parts(T + 1, 7, 40),
                ulid_from_parts(T + 1, 7, 41),
            ]
        );
        let mut server = Allocator::new();
        assert_eq!(
            server.allocate_set_based(NOW, &[T, T - 5, T + 1, T], 7, 40),
            u
        );
        assert_eq!(server.state(), shard.state());
    }

    #[test]
    fn set_based_prefix_then_new_groups() {
        let state = ShardState {
            last_ms: T,
            high: high_part(T, 0x0101),
            next_counter: 10,
        };
        let hints = [T - 1, T, T + 2, T + 2, T + 3];
        let mut server = Allocator::with_state(state);
        let u = server.allocate_set_based(NOW, &hints, 0xEEEE, -1);
        let s = COUNTER_MASK;
        assert_eq!(
            u,
            vec![
                ulid_from_parts(T, 0x0101, 10),
                ulid_from_parts(T, 0x0101, 11),
                ulid_from_parts(T + 2, 0xEEEE, s),
                ulid_from_parts(T + 2, 0xEEEE, s + 1),
                ulid_from_parts(T + 3, 0xEEEE, s),
            ]
        );
        assert_eq!(
            server.state(),
            Some(ShardState {
                last_ms: T + 3,
                high: high_part(T + 3, 0xEEEE),
                next_counter: s + 1,
            })
        );
        let mut shard = Allocator::with_state(state);
        assert_eq!(
            shard.allocate(NOW, &hints, &mut FixedRandom::new(0xEEEE, -1)),
            u
        );
        assert_eq!(shard.state(), server.state());
    }

    #[test]
    fn far_future_and_pre_epoch_hints_are_clamped() {
        let mut shard = Allocator::new();
        let u = shard.allocate(NOW, &[-10, i64::MAX, 5], &mut FixedRandom::new(1, 2));
        assert_eq!(ulid_ms(u[0]), 0);
        assert_eq!(ulid_ms(u[1]), NOW + HINT_TOLERANCE_MS);
        assert_eq!(ulid_ms(u[2]), NOW + HINT_TOLERANCE_MS);
        assert!(u[0] < u[1] && u[1] < u[2]);

        // A year-9999 hint moves the shard's clock no further than the tolerance: the next
        // move, a second later, starts a new millisecond at its own clock again.
        let mut shard = Allocator::new();
        let far = shard.reserve(NOW, MAX_MS, 1, &mut FixedRandom::new(1, 2));
        assert_eq!(ulid_ms(far.first()), NOW + HINT_TOLERANCE_MS);
        let later = NOW + 2 * HINT_TOLERANCE_MS;
        let next = shard.reserve(later, later, 1, &mut FixedRandom::new(3, 4));
        assert_eq!(ulid_ms(next.first()), later);
        assert!(far.last() < next.first());
    }

    #[test]
    fn reserve_same_ms_advances_by_count_and_new_ms_gets_new_high() {
        let mut shard = Allocator::new();
        let mut random = FixedRandom::new(0x4242, 3);
        let a = shard.reserve(NOW, T, RESERVATION_SIZE, &mut random);
        let b = shard.reserve(NOW, T - 1, RESERVATION_SIZE, &mut random);
        assert_eq!(a.first(), ulid_from_parts(T, 0x4242, 3));
        assert_eq!(b.first_counter(), 3 + RESERVATION_SIZE);
        assert_eq!(a.high(), b.high());
        assert_eq!(a.nth(1), Some(a.first()));
        assert_eq!(a.nth(RESERVATION_SIZE), Some(a.last()));
        assert_eq!(a.nth(0), None);
        assert_eq!(a.nth(RESERVATION_SIZE + 1), None);
        assert_eq!(a.len(), RESERVATION_SIZE);
        assert!(!a.is_empty());
        assert!(a.last() < b.first());

        let c = shard.reserve(NOW, T + 1, 1, &mut FixedRandom::new(0x0001, 9));
        assert_eq!(c.first(), ulid_from_parts(T + 1, 0x0001, 9));
        assert!(b.last() < c.first());
        assert_eq!(shard.state().unwrap().next_counter, 10);
    }

    #[test]
    fn full_headroom_is_usable_from_either_sign() {
        for start in [0x3FFF_FFFF_FFFF_FFFF, i64::MIN, COUNTER_MASK, 0] {
            let mut shard = Allocator::new();
            let r = shard.reserve(NOW, T, 1 << 62, &mut FixedRandom::new(0, start));
            assert_eq!(r.first_counter() < 0, ulid_counter(r.last()) < 0);
            assert!(r.first() < r.last());
        }
    }

    #[test]
    #[should_panic(expected = "headroom")]
    fn crossing_zero_under_one_high_is_refused() {
        let mut shard = Allocator::with_state(ShardState {
            last_ms: T,
            high: high_part(T, 0),
            next_counter: -2,
        });
        shard.allocate(NOW, &[T, T, T], &mut OsRandom);
    }

    #[test]
    #[should_panic(expected = "headroom")]
    fn set_based_crossing_zero_is_refused() {
        let mut shard = Allocator::with_state(ShardState {
            last_ms: T,
            high: high_part(T, 0),
            next_counter: -2,
        });
        shard.allocate_set_based(NOW, &[T, T, T], 0, 0);
    }

    #[test]
    #[should_panic(expected = "headroom")]
    fn overflowing_the_counter_is_refused() {
        let mut shard = Allocator::with_state(ShardState {
            last_ms: T,
            high: high_part(T, 0),
            next_counter: i64::MAX - 1,
        });
        shard.reserve(NOW, T, 5, &mut OsRandom);
    }

    #[test]
    #[should_panic(expected = "at least one")]
    fn empty_reservation_is_refused() {
        Allocator::new().reserve(NOW, T, 0, &mut OsRandom);
    }

    #[test]
    fn os_random_counter_starts_are_masked() {
        let mut r = OsRandom;
        for _ in 0..1000 {
            assert_eq!(r.counter_start() & (1 << 62), 0);
        }
    }
}
