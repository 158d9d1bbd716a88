-- The per-shard ULID allocator (ARCHITECTURE.md, "ULIDs and the allocator"), set-based form: the ULID of one row of a batch.
--
-- A ULID is ms(6 bytes, big-endian) || random16 (2 bytes) || counter (8 bytes, big-endian
-- two's complement). The caller passes, per row in order_sequence order:
--   @ms              the row's time hint in ms since 1970, already clamped to 0 .. the server's
--                    clock + 1000 ms and lifted to the running max (read_feed and lock_feed do
--                    both; src/allocator.rs clamp_hint is the same rule)
--   @position        1-based position of the row in the batch
--   @position_in_ms  1-based position of the row among the batch rows with the same @ms
-- and, once per batch, the shard's state (all null for a shard with no state row yet) and one
-- random16 and one counter start (bit 62 cleared) drawn for every new millisecond of the batch.
--
-- Rows whose ms is not later than the state's continue the state's high part and counter; the
-- lift makes them a prefix of the batch, so @position numbers them. Rows of a later ms start
-- that ms: high = ms || random16, counter = start + position within the ms. This equals the
-- row-by-row rule fed the same random values (the Rust model in src/allocator.rs proves it).
--
-- It is an inline table-valued function, not a scalar one, so the optimizer folds it into the
-- caller's plan (no per-row call), and callers need no permission on a table type.
create or alter function [changefeed].[ulid_at] (
    @ms bigint,
    @position bigint,
    @position_in_ms bigint,
    @state_ms bigint,
    @state_high binary(8),
    @state_next bigint,
    @random16 binary(2),
    @counter_start bigint
)
returns table
as
return
select
    convert(
        binary(16),
        case
            when @state_ms is not null and @ms <= @state_ms
                then @state_high + convert(binary(8), @state_next + @position - 1)
            else
                convert(binary(6), @ms)
                + @random16
                + convert(binary(8), @counter_start + @position_in_ms - 1)
        end
    ) as ulid;
