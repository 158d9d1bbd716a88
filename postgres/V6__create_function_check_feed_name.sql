-- Splits a feed name 'schema.table' into {schema, table}, or refuses it with CF000. The
-- parts are catalog names as they are spelled (no case folding: 'App.Events' is the table
-- "App"."Events"), so that a name means the same here, in Rust's changefeed::Feed and on
-- SQL Server. The rule is Feed's: exactly one dot; each part 1 to 63 bytes (PostgreSQL's
-- identifier limit), without control characters, [ ] ' " . \ or a leading or trailing
-- space; not the changefeed schema. Every later use quotes the parts (format's %I), so
-- capitals, spaces and Unicode are safe; the refused characters are refused for Feed's sake.
create function changefeed.check_feed_name(p_name text)
returns text[]
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_parts text[] := string_to_array(p_name, '.');
    v_part text;
    v_problem text;
begin
    if p_name is null or cardinality(v_parts) <> 2 then
        v_problem := 'it is not two names joined by one dot';
    else
        foreach v_part in array v_parts loop
            if v_part = '' or octet_length(v_part) > 63 then
                v_problem := 'each part must be 1 to 63 bytes';
            elsif v_part ~ '[[:cntrl:]]' or v_part ~ '[][''"\\]' then
                v_problem := 'a part contains a control character or one of [ ] '' " \';
            elsif v_part <> btrim(v_part, ' ') then
                v_problem := 'a part begins or ends with a space';
            end if;
        end loop;
        if v_problem is null and v_parts[1] = 'changefeed' then
            v_problem := 'the changefeed schema belongs to changefeed';
        end if;
    end if;
    if v_problem is not null then
        raise exception using
            errcode = 'CF000',
            message = format('changefeed: %s is not a usable feed name: %s',
                coalesce(quote_literal(p_name), 'NULL'), v_problem),
            hint = 'Name the event table as schema.table, spelled as in the catalog '
                || '(e.g. app.events, or App.Events for the table "App"."Events").';
    end if;
    return v_parts;
end
$$;
