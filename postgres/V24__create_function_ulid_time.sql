-- The time a ULID carries (its first 6 bytes: ms since 1970-01-01 UTC), or NULL for NULL or a
-- value that is not 16 bytes. Any 16 bytes may be a cursor, so a time past PostgreSQL's range
-- (6 bytes reach year 10889; timestamptz reaches 294276) cannot occur.
create function changefeed.ulid_time(p_ulid bytea)
returns timestamptz
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
    select case when octet_length(p_ulid) = 16 then
        to_timestamp(0) + (
            ('x' || encode(substring(p_ulid from 1 for 6), 'hex'))::bit(48)::bigint
            * interval '1 millisecond')
    end
$$;
