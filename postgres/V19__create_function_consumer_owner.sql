-- The role that owns the consumer p_consumer of feed p_feed_id (the one whose save_cursor
-- created it), or NULL. save_cursor and load_cursor run with their caller's rights, and the
-- caller's row-level security hides other roles' consumers; this function alone looks past it,
-- so that a save under another role's consumer is refused by name (CF114) instead of failing
-- on the primary key. It returns a role name only.
create function changefeed.consumer_owner(p_consumer text, p_feed_id integer)
returns name
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select c.owner from changefeed.consumer_cursor as c
    where c.consumer = p_consumer and c.feed_id = p_feed_id
    limit 1
$$;
