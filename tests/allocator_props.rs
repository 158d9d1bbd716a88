//! Property tests of the reference ULID allocator (ARCHITECTURE.md, "ULIDs and the allocator").

use changefeed::allocator::{
    Allocator, COUNTER_MASK, FixedRandom, HINT_TOLERANCE_MS, MAX_MS, RESERVATION_SIZE, RandomParts,
    ShardState, UlidRange, clamp_hint, latest_ms, mask_counter, ulid_counter, ulid_from_parts,
    ulid_high, ulid_ms, ulid_random16,
};
use proptest::prelude::*;
use ulid::Ulid;

/// 2023-01-02T15:04:05Z
const T: i64 = 1_672_671_845_000;

/// Random parts replayed from proptest-generated lists; it also counts the
/// draws so a test can tell which value a new millisecond received.
#[derive(Clone, Debug)]
struct ScriptedRandom {
    random16: Vec<u16>,
    raw_starts: Vec<i64>,
    drawn16: usize,
    drawn_starts: usize,
}

impl ScriptedRandom {
    fn new(random16: Vec<u16>, raw_starts: Vec<i64>) -> Self {
        Self {
            random16,
            raw_starts,
            drawn16: 0,
            drawn_starts: 0,
        }
    }
}

impl RandomParts for ScriptedRandom {
    fn random16(&mut self) -> u16 {
        let v = self.random16[self.drawn16 % self.random16.len()];
        self.drawn16 += 1;
        v
    }

    fn counter_start(&mut self) -> i64 {
        let v = mask_counter(self.raw_starts[self.drawn_starts % self.raw_starts.len()]);
        self.drawn_starts += 1;
        v
    }
}

fn scripted_random() -> impl Strategy<Value = ScriptedRandom> {
    (
        prop::collection::vec(any::<u16>(), 1..16),
        prop::collection::vec(raw_counter(), 1..16),
    )
        .prop_map(|(r, s)| ScriptedRandom::new(r, s))
}

/// Raw counter draws, biased to the edges of both signs.
fn raw_counter() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => any::<i64>(),
        1 => Just(-1i64),
        1 => Just(0i64),
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => Just(0x3FFF_FFFF_FFFF_FFFF),
        1 => Just(i64::MIN | 0x3FFF_FFFF_FFFF_FFFF),
    ]
}

/// Hints around one instant: lots of repeats and backwards steps.
fn near_hint() -> impl Strategy<Value = i64> {
    (T - 20..T + 40).boxed()
}

/// Any hint, including pre-epoch, zero and far-future ones.
fn wild_hint() -> impl Strategy<Value = i64> {
    prop_oneof![
        40 => T - 20..T + 40,
        2 => -1_000i64..=0,
        1 => Just(0i64),
        1 => MAX_MS - 3..=MAX_MS + 3,
        1 => any::<i64>(),
    ]
}

/// The server's clock when a batch moves: mostly a minute after the hints near `T` (none
/// clamped), sometimes inside them (later ones clamped), sometimes the end of datetime2.
fn clock() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => Just(T + 60_000),
        2 => T - 30..T + 50,
        1 => Just(MAX_MS),
    ]
}

/// A batch of hints; most cases avoid extreme hints, since a single hint at
/// MAX_MS turns every later row into a continuation.
fn batches() -> impl Strategy<Value = Vec<Vec<i64>>> {
    prop_oneof![
        prop::collection::vec(prop::collection::vec(near_hint(), 0..200), 0..50),
        prop::collection::vec(prop::collection::vec(wild_hint(), 0..200), 0..50),
    ]
}

/// Counters a case may still issue under the starting high: 50 batches of
/// fewer than 200 rows.
const BATCH_HEADROOM: i64 = 10_000;
/// Same for cases that also reserve: 50 server-sized reservations.
const RESERVE_HEADROOM: i64 = 50 * RESERVATION_SIZE + BATCH_HEADROOM;

/// A valid stored state: its run started at a masked counter and has issued
/// between 1 and almost 2^62 counters, including runs near the top that
/// leave just `headroom` (up to twice that) before 2^62.
fn shard_state(headroom: i64) -> impl Strategy<Value = ShardState> {
    let top = 1i64 << 62;
    let issued = prop_oneof![1i64..1_000, top - 2 * headroom..=top - headroom];
    (
        prop_oneof![4 => T - 20..T + 40, 1 => Just(0i64), 1 => Just(MAX_MS)],
        any::<u16>(),
        raw_counter(),
        issued,
    )
        .prop_map(|(ms, r, raw, issued)| {
            let start = mask_counter(raw);
            ShardState {
                last_ms: ms,
                high: ulid_high(ulid_from_parts(ms, r, 0)),
                next_counter: start + issued,
            }
        })
}

/// A case for the set-based rule: a starting state, the clock, batches of hints, and the
/// server's fresh draws (random16 and counter start) for each batch.
#[allow(clippy::type_complexity)]
fn set_based_case()
-> impl Strategy<Value = (Option<ShardState>, i64, Vec<Vec<i64>>, Vec<(u16, i64)>)> {
    (
        start_state(BATCH_HEADROOM),
        clock(),
        batches(),
        prop::collection::vec((any::<u16>(), raw_counter()), 50),
    )
}

fn start_state(headroom: i64) -> impl Strategy<Value = Option<ShardState>> {
    prop_oneof![1 => Just(None), 3 => shard_state(headroom).prop_map(Some)]
}

fn allocator_from(state: Option<ShardState>) -> Allocator {
    state.map_or_else(Allocator::new, Allocator::with_state)
}

fn lifted(hints: &[i64], now: i64) -> Vec<i64> {
    let mut running = 0;
    hints
        .iter()
        .map(|&h| {
            running = running.max(clamp_hint(h, now));
            running
        })
        .collect()
}

fn assert_increasing(last: &mut Option<Ulid>, u: Ulid) -> Result<(), TestCaseError> {
    if let Some(prev) = *last {
        prop_assert!(prev < u, "{prev} is not below {u}");
    }
    *last = Some(u);
    Ok(())
}

/// A batch got one ULID per hint, each above everything issued before it.
fn assert_batch_increasing(
    last: &mut Option<Ulid>,
    batch: &[i64],
    ulids: Vec<Ulid>,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(ulids.len(), batch.len());
    for u in ulids {
        assert_increasing(last, u)?;
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    Batch(Vec<i64>),
    Reserve(i64, i64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        prop::collection::vec(wild_hint(), 0..200).prop_map(Op::Batch),
        prop::collection::vec(near_hint(), 0..200).prop_map(Op::Batch),
        (
            wild_hint(),
            prop_oneof![Just(RESERVATION_SIZE), 1i64..1_000]
        )
            .prop_map(|(h, n)| Op::Reserve(h, n)),
        (near_hint(), Just(RESERVATION_SIZE)).prop_map(|(h, n)| Op::Reserve(h, n)),
    ];
    prop::collection::vec(op, 0..50)
}

fn check_range(r: &UlidRange) -> Result<(), TestCaseError> {
    let last = r.nth(r.len()).expect("last element exists");
    prop_assert_eq!(last, r.last());
    prop_assert_eq!(ulid_high(last), r.high());
    prop_assert_eq!(ulid_counter(last), r.first_counter() + (r.len() - 1));
    prop_assert!(r.first() <= last);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Row-by-row rule with an arbitrary random source: strictly increasing.
    #[test]
    fn row_by_row_is_strictly_increasing(
        state in start_state(BATCH_HEADROOM),
        now in clock(),
        batches in batches(),
        mut random in scripted_random(),
    ) {
        let mut shard = allocator_from(state);
        let mut last = None;
        for batch in &batches {
            let ulids = shard.allocate(now, batch, &mut random);
            assert_batch_increasing(&mut last, batch, ulids)?;
        }
    }

    /// The server's set-based rule, fresh draws per batch: strictly increasing.
    #[test]
    fn set_based_is_strictly_increasing(
        (state, now, batches, draws) in set_based_case(),
    ) {
        let mut shard = allocator_from(state);
        let mut last = None;
        for (batch, &(r16, raw)) in batches.iter().zip(&draws) {
            let ulids = shard.allocate_set_based(now, batch, r16, raw);
            assert_batch_increasing(&mut last, batch, ulids)?;
        }
    }

    /// Reservations interleaved with both batch rules: every ULID of every
    /// range and batch is above everything issued before it.
    #[test]
    fn reservations_and_batches_interleave_increasing(
        state in start_state(RESERVE_HEADROOM),
        now in clock(),
        ops in ops(),
        mut random in scripted_random(),
        set_based in prop::collection::vec(any::<bool>(), 50),
    ) {
        let mut shard = allocator_from(state);
        let mut last = None;
        for (op, &use_set) in ops.iter().zip(&set_based) {
            match op {
                Op::Batch(hints) => {
                    let ulids = if use_set {
                        let r16 = random.random16();
                        let start = random.counter_start();
                        shard.allocate_set_based(now, hints, r16, start)
                    } else {
                        shard.allocate(now, hints, &mut random)
                    };
                    for u in ulids {
                        assert_increasing(&mut last, u)?;
                    }
                }
                Op::Reserve(hint, count) => {
                    let r = shard.reserve(now, *hint, *count, &mut random);
                    prop_assert_eq!(r.len(), *count);
                    check_range(&r)?;
                    assert_increasing(&mut last, r.first())?;
                    // check_range already showed first <= last inside the range.
                    last = Some(r.last());
                }
            }
        }
    }

    /// Set-based equals row-by-row fed the same fixed values, ULIDs and
    /// state, batch after batch, from any valid starting state.
    #[test]
    fn set_based_equals_row_by_row(
        (state, now, batches, draws) in set_based_case(),
    ) {
        let mut server = allocator_from(state);
        let mut model = allocator_from(state);
        for (batch, &(r16, raw)) in batches.iter().zip(&draws) {
            let expected = model.allocate(now, batch, &mut FixedRandom::new(r16, raw));
            let got = server.allocate_set_based(now, batch, r16, raw);
            prop_assert_eq!(got, expected);
            prop_assert_eq!(server.state(), model.state());
        }
    }

    /// Layout of every row, stated per row rather than as a state machine:
    /// continuing rows use the state's high and next counters; a new
    /// millisecond gets its lifted ms, the next random16 drawn, and counters
    /// start + index within its group.
    #[test]
    fn layout_matches_the_rule(
        state in start_state(BATCH_HEADROOM),
        now in clock(),
        batches in batches(),
        mut random in scripted_random(),
    ) {
        let mut shard = allocator_from(state);
        for batch in &batches {
            let before = shard.state();
            let r16_drawn = random.drawn16;
            let starts_drawn = random.drawn_starts;
            let ulids = shard.allocate(now, batch, &mut random);
            let lifted = lifted(batch, now);

            // The distinct new milliseconds, in the order they draw random parts.
            let mut new_ms: Vec<i64> = lifted
                .iter()
                .copied()
                .filter(|&ms| before.is_none_or(|s| ms > s.last_ms))
                .collect();
            new_ms.dedup();

            let mut k = 0i64; // index among continuing rows
            for (i, (&u, &ms)) in ulids.iter().zip(&lifted).enumerate() {
                match before {
                    Some(s) if ms <= s.last_ms => {
                        prop_assert_eq!(ulid_high(u), s.high);
                        prop_assert_eq!(ulid_ms(u), s.last_ms);
                        prop_assert_eq!(ulid_counter(u), s.next_counter + k);
                        k += 1;
                    }
                    _ => {
                        let first_of_group = lifted.iter().position(|&x| x == ms).unwrap();
                        let group = new_ms.iter().position(|&x| x == ms).unwrap();
                        let idx16 = (r16_drawn + group) % random.random16.len();
                        let idx_start = (starts_drawn + group) % random.raw_starts.len();
                        let start = mask_counter(random.raw_starts[idx_start]);
                        prop_assert_eq!(ulid_ms(u), ms);
                        prop_assert_eq!(ulid_random16(u), random.random16[idx16]);
                        prop_assert_eq!(ulid_counter(u), start + (i - first_of_group) as i64);
                        prop_assert_eq!(ulid_counter(u) < 0, start < 0, "counter changed sign");
                    }
                }
            }
        }
    }

    /// Headroom: a masked start plus any number of additions up to 2^62
    /// neither overflows nor changes sign, so byte order equals counter order.
    #[test]
    fn masked_start_has_2_pow_62_headroom(raw in raw_counter(), add in 0i64..=1 << 62) {
        let start = mask_counter(raw);
        prop_assert_eq!(start & (1 << 62), 0);
        let end = start.checked_add(add);
        prop_assert!(end.is_some());
        let end = end.unwrap();
        prop_assert_eq!(end < 0, start < 0);
        let (a, b) = (ulid_from_parts(T, 0, start), ulid_from_parts(T, 0, end));
        prop_assert!(a <= b);
        prop_assert_eq!(a == b, add == 0);
    }

    /// reserve: +1 inside a range, +count between reservations of the same
    /// millisecond (same high), and a new high for a later millisecond.
    #[test]
    fn reserve_steps(
        state in start_state(RESERVE_HEADROOM),
        now in clock(),
        hints in prop::collection::vec(near_hint(), 1..40),
        counts in prop::collection::vec(prop_oneof![Just(RESERVATION_SIZE), 1i64..1_000], 40),
        picks in prop::collection::vec(1i64..=RESERVATION_SIZE, 40),
        mut random in scripted_random(),
    ) {
        let mut shard = allocator_from(state);
        let mut prev: Option<(i64, UlidRange)> = None;
        for ((&hint, &count), &pick) in hints.iter().zip(&counts).zip(&picks) {
            let before = shard.state();
            let r = shard.reserve(now, hint, count, &mut random);
            check_range(&r)?;

            let i = 1 + (pick - 1) % count;
            if i < count {
                let a = r.nth(i).unwrap();
                let b = r.nth(i + 1).unwrap();
                prop_assert_eq!(ulid_high(a), ulid_high(b));
                prop_assert_eq!(ulid_counter(b), ulid_counter(a) + 1);
                prop_assert!(a < b);
            }
            prop_assert_eq!(r.nth(0), None);
            prop_assert_eq!(r.nth(count + 1), None);

            match before {
                Some(s) if clamp_hint(hint, now) <= s.last_ms => {
                    prop_assert_eq!(r.high(), s.high);
                    prop_assert_eq!(r.first_counter(), s.next_counter);
                    if let Some((prev_count, p)) = prev {
                        prop_assert_eq!(r.high(), p.high());
                        prop_assert_eq!(r.first_counter(), p.first_counter() + prev_count);
                    }
                }
                _ => {
                    prop_assert_eq!(ulid_ms(r.first()), clamp_hint(hint, now));
                    if let Some(s) = before {
                        prop_assert_ne!(r.high(), s.high);
                    }
                }
            }
            prop_assert_eq!(shard.state().unwrap().next_counter, r.first_counter() + count);
            if let Some((_, p)) = prev {
                prop_assert!(p.last() < r.first());
            }
            prev = Some((count, r));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Clamped hints (issue 10, B8): no ULID is later than the server's clock at its move plus
    /// HINT_TOLERANCE_MS, unless the shard's clock already was (it never goes back), so one
    /// far-future hint moves the shard's clock at most the tolerance past the server's.
    #[test]
    fn ulid_time_never_passes_the_clock_plus_the_tolerance(
        state in start_state(RESERVE_HEADROOM),
        ops in ops(),
        clocks in prop::collection::vec(clock(), 50),
        mut random in scripted_random(),
    ) {
        let mut shard = allocator_from(state);
        for (op, &now) in ops.iter().zip(&clocks) {
            let bound = latest_ms(now).max(shard.state().map_or(0, |s| s.last_ms));
            let issued: Vec<Ulid> = match op {
                Op::Batch(hints) => shard.allocate(now, hints, &mut random),
                Op::Reserve(hint, count) => {
                    let r = shard.reserve(now, *hint, *count, &mut random);
                    vec![r.first(), r.last()]
                }
            };
            for u in issued {
                prop_assert!(
                    ulid_ms(u) <= bound,
                    "{u} carries {} ms, past the bound {bound} (clock {now})",
                    ulid_ms(u)
                );
            }
            if let Some(s) = shard.state() {
                prop_assert!(s.last_ms <= bound);
            }
        }
    }
}

/// The SQL templates clamp with the same tolerance as the model (read_feed moving outbox rows,
/// lock_feed reserving): a change on one side only would make the model disagree with the
/// server.
#[test]
fn the_sql_templates_use_the_models_hint_tolerance() {
    let declaration = format!("declare @hint_tolerance_ms bigint = {HINT_TOLERANCE_MS};");
    for (file, text) in [
        (
            "V15 read_feed",
            include_str!("../sql/V15__create_template_read_feed.sql"),
        ),
        (
            "V42 lock_feed",
            include_str!("../sql/V42__create_template_lock_feed.sql"),
        ),
    ] {
        assert_eq!(
            text.matches(declaration.as_str()).count(),
            1,
            "{file} must declare `{declaration}` once"
        );
    }
}

/// Two server-sized reservations in one millisecond are exactly 10^11 apart.
#[test]
fn reserve_same_ms_is_exactly_one_reservation_apart() {
    let mut shard = Allocator::new();
    let mut random = FixedRandom::new(0x1234, -1);
    let a = shard.reserve(T, T, RESERVATION_SIZE, &mut random);
    let b = shard.reserve(T, T, RESERVATION_SIZE, &mut random);
    assert_eq!(a.high(), b.high());
    assert_eq!(b.first_counter() - a.first_counter(), 100_000_000_000);
    assert_eq!(
        ulid_counter(b.first()),
        ulid_counter(a.nth(RESERVATION_SIZE).unwrap()) + 1
    );
}

/// The carry vector, for both batch rules and for a reservation.
#[test]
fn carry_vector() {
    const FIRST: &str = "01GNSG5PM8ZZZVZZZZZZZZZZZZ";
    const HUNDREDTH: &str = "01GNSG5PM8ZZZW000000000033";
    assert_eq!(mask_counter(-1), COUNTER_MASK);
    assert_eq!(COUNTER_MASK as u64, 0xBFFF_FFFF_FFFF_FFFF);

    let hints = [T; 101];
    let mut model = Allocator::new();
    let rows = model.allocate(T, &hints, &mut FixedRandom::new(0xFFFF, -1));
    assert_eq!(rows[0].to_string(), FIRST);
    assert_eq!(rows[100].to_string(), HUNDREDTH);

    let mut server = Allocator::new();
    assert_eq!(server.allocate_set_based(T, &hints, 0xFFFF, -1), rows);

    let mut writer = Allocator::new();
    let range = writer.reserve(T, T, 101, &mut FixedRandom::new(0xFFFF, -1));
    assert_eq!(range.first().to_string(), FIRST);
    assert_eq!(range.nth(101).unwrap().to_string(), HUNDREDTH);
    assert_eq!(Ulid::from_string(HUNDREDTH).unwrap(), range.last());
}
