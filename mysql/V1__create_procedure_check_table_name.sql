-- Refuses, with error 51000, an outbox table name changefeed cannot use. The rule is the one
-- changefeed::mysql::OutboxTable applies in Rust: 1-48 ASCII letters, digits and
-- underscores, not starting with a digit, not starting with "changefeed" (the bundle's own
-- objects). 48 leaves room in MySQL's 64-character identifiers for derived names. Such a
-- name needs no escaping inside backquotes, so dynamic SQL built with it cannot be injected.
-- Characters are checked by code point (ord), not with REGEXP: MySQL 8 refuses binary
-- strings in REGEXP, and a case- or accent-insensitive match would let 'é' pass as 'e'.
create procedure changefeed_check_table_name(in p_table_name varchar(255))
    no sql
    sql security invoker
begin
    declare v_message varchar(512);
    declare v_ok boolean default p_table_name is not null
        and char_length(p_table_name) between 1 and 48
        and lower(p_table_name) not like 'changefeed%'
        and ord(substring(p_table_name, 1, 1)) not between 48 and 57;
    declare v_code int;
    declare v_at int default 1;

    while v_ok and v_at <= char_length(p_table_name) do
        set v_code = ord(substring(p_table_name, v_at, 1));
        set v_ok = v_code between 48 and 57 -- 0-9
            or v_code between 65 and 90 -- A-Z
            or v_code between 97 and 122 -- a-z
            or v_code = 95; -- _
        set v_at = v_at + 1;
    end while;

    if not v_ok then
        set v_message = concat(
            'changefeed_setup_outbox: ', coalesce(quote(p_table_name), 'NULL'),
            ' is not a usable outbox table name. Use 1-48 ASCII letters, digits and',
            ' underscores, not starting with a digit or with "changefeed".'
        );
        signal sqlstate '45000' set mysql_errno = 51000, message_text = v_message;
    end if;
end
