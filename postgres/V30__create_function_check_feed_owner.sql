-- Refuses (CF116) a caller that is not the feed's owner: a role with the rights of the role
-- that owns the feed's tables (the one that ran setup_feed, unless they were given to
-- another since), a superuser included. Deciding which consumers' cursors hold purge_feed
-- back is the feed owner's (register_consumer, unregister_consumer): a member of only the
-- feed's readers role must not make its own consumers pin retention.
create function changefeed.check_feed_owner(p_function text, p_feed changefeed.feeds)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_owner name;
begin
    -- state_<id> exists in both modes and belongs to setup_feed's caller.
    select pg_get_userbyid(c.relowner) into v_owner
    from pg_class as c
    where c.oid = to_regclass(format('changefeed.state_%s', p_feed.feed_id));
    if v_owner is null or not pg_has_role(current_user, v_owner, 'USAGE') then
        raise exception using
            errcode = 'CF116',
            message = format('changefeed.%s: the role %I is not the owner of the feed %s (%s)',
                p_function, current_user, p_feed.name, coalesce(quote_ident(v_owner), 'its tables are gone')),
            hint = 'Ask the feed''s owner (the role that set it up) to call it, or grant that role '
                || 'to yours.';
    end if;
end
$$;
