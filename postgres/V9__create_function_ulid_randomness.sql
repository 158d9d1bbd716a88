-- One batch's random parts for changefeed.assign_ulids: random16 (2 bytes) and a raw counter
-- draw (8 bytes as a bigint; assign_ulids clears bit 62). From gen_random_uuid() (core since
-- PostgreSQL 13, a strong random source): a version 4 UUID is random but for 6 bits, the
-- version nibble of byte 7 and the variant bits of byte 9, which are left out here.
create function changefeed.ulid_randomness(out random16 bytea, out counter_draw bigint)
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_bytes bytea := uuid_send(gen_random_uuid());
begin
    random16 := substring(v_bytes from 11 for 2);
    -- Bytes 1-6 and 13-14: 8 bytes that are all random.
    counter_draw := ('x' || encode(substring(v_bytes from 1 for 6)
        || substring(v_bytes from 13 for 2), 'hex'))::bit(64)::bigint;
end
$$;
