-- The advisory-lock key of a feed's shard: the mover of read_feed (outbox mode) and lock_feed
-- (serialized mode) hold it until their transaction ends. Advisory keys are shared by every
-- application of the database, so the key is not a hash of names: its top 16 bits are the
-- class 0x6366 ('cf'), then the feed id (28 bits) and the shard (20 bits; a feed has at most
-- 2^20 shards, setup_feed's limit). Two feeds or shards never share a key, and another
-- application collides only if it uses keys in the same class.
create function changefeed.shard_lock_key(p_feed_id integer, p_shard integer)
returns bigint
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
    select (x'6366'::bigint << 48) | (p_feed_id::bigint << 20) | p_shard::bigint
$$;
