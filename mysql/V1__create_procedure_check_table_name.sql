-- Refuses, with error 51000, an outbox table name changefeed cannot use. The rule is the one
-- changefeed::mysql::OutboxTable applies in Rust: 1-48 ASCII letters, digits and
-- underscores, not starting with a digit, not starting with "changefeed" (the bundle's own
-- objects). 48 leaves room in MySQL's 64-character identifiers for derived names. Such a
-- name needs no escaping inside backquotes, so dynamic SQL built with it cannot be injected.
create procedure changefeed_check_table_name(in p_table_name varchar(255))
    no sql
    sql security invoker
begin
    declare v_message varchar(512);

    -- binary: the character classes mean ASCII whatever the connection's collation.
    if p_table_name is null
        or binary p_table_name not regexp binary '^[A-Za-z_][A-Za-z0-9_]{0,47}$'
        or lower(p_table_name) like 'changefeed%' then
        set v_message = concat(
            'changefeed_setup_outbox: ', coalesce(quote(p_table_name), 'NULL'),
            ' is not a usable outbox table name. Use 1-48 ASCII letters, digits and',
            ' underscores, not starting with a digit or with "changefeed".'
        );
        signal sqlstate '45000' set mysql_errno = 51000, message_text = v_message;
    end if;
end
