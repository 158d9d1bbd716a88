-- The per-shard ULID allocator (ARCHITECTURE.md, "ULIDs and the allocator"), the same layout
-- and rules as the SQL Server bundle's changefeed.ulid_at, written once for PostgreSQL: the
-- feed's mover (read_feed at the head) and lock_feed both call it, and
-- changefeed::allocator::Allocator::allocate_set_based is its model, checked bit for bit by
-- tests/live_postgres_feed.rs.
--
-- A ULID is ms (6 bytes, big-endian) || random16 (2 bytes) || counter (8 bytes, big-endian
-- two's complement). Given one batch's time hints in ms, in the order the rows get their
-- ULIDs, the shard's state (all NULL for a shard never used), the server's clock in ms and
-- one random16 and one raw counter draw for the batch, it returns each row's ULID by position
-- (1-based):
--   * each hint is clamped to 0 .. now + 1000 ms (one wrong hint, a client's clock or year
--     9999, cannot move the shard's clock ahead for good; allocator::HINT_TOLERANCE_MS), then
--     lifted to the running maximum, so ULID time never goes back within the batch;
--   * rows at or before the state's millisecond continue the state's high part and counter
--     (the lift makes them a prefix of the batch, so their position numbers them);
--   * rows of a later millisecond start it: ms || random16, counter = the draw with bit 62
--     cleared + the row's position within its millisecond - 1. Clearing bit 62 leaves 2^62
--     additions before the counter could overflow or change sign (a negative counter sorts
--     after every positive one in byte order).
-- It is pure (the caller draws the random parts), so the test can feed fixed values.
-- PL/pgSQL running one query, not a SQL function: a SQL function with a SET clause is
-- planned again at every call (it cannot be inlined), and lock_feed calls this while it
-- holds the shard's lock; PL/pgSQL keeps the plan for the session.
-- int8send gives a bigint's 8 bytes big-endian, two's complement, as SQL Server's
-- convert(binary(8), bigint) does.
create function changefeed.assign_ulids(
    p_hints_ms bigint[],
    p_now_ms bigint,
    p_state_ms bigint,
    p_state_high bytea,
    p_state_next bigint,
    p_random16 bytea,
    p_counter_draw bigint
)
returns table (ordinal bigint, ulid bytea)
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    return query
    with clamped as (
        select
            h.ordinal,
            greatest(0, least(h.ms, least(p_now_ms + 1000, 253402300799999))) as ms
        from unnest(p_hints_ms) with ordinality as h (ms, ordinal)
    ),

    lifted as (
        select
            c.ordinal,
            max(c.ms) over (order by c.ordinal rows unbounded preceding) as ms
        from clamped as c
    ),

    numbered as (
        select
            l.ordinal,
            l.ms,
            row_number() over (partition by l.ms order by l.ordinal) as ordinal_in_ms
        from lifted as l
    )

    select
        n.ordinal,
        case
            when p_state_ms is not null and n.ms <= p_state_ms
                then p_state_high || int8send(p_state_next + n.ordinal - 1)
            else
                substring(int8send(n.ms) from 3 for 6)
                || p_random16
                || int8send((p_counter_draw & ~(1::bigint << 62)) + n.ordinal_in_ms - 1)
        end
    from numbered as n
    order by n.ordinal;
end
$$;
