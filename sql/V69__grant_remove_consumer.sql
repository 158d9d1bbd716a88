-- remove_consumer checks who calls it (the consumer's owner in the feed's readers role, or
-- db_owner), as save_cursor and load_cursor do; the grant only lets a consumer's owner reach
-- it without a grant per feed.
grant execute on object::[changefeed].[remove_consumer] to public;
