-- The schema of the bundle's own functions, and the rule for outbox names.
--
-- Every function of the bundle lives in the schema changefeed and names every object it
-- uses with its schema, and each one runs with search_path = pg_catalog, pg_temp: a caller's
-- search_path can neither hide them nor put another function in their place.
create schema if not exists changefeed;

-- Splits a 'schema.table' outbox name into {schema, table}, or refuses it with SQLSTATE
-- CF000 (the number 51000 of the other bundles). The rule is the one
-- changefeed::postgres::OutboxTable applies in Rust:
--   * two parts, each lower-case ASCII letters, digits and underscores, not starting with a
--     digit: names that need no quoting and that PostgreSQL does not fold (a table made
--     as "Outbox" would need quotes in every query of the user's own);
--   * the table at most 40 characters, so that index names (table plus a suffix of up to
--     12) fit PostgreSQL's 63-byte identifiers;
--   * 'schema.table' at most 52 characters, so that the notify channel
--     'changefeed:' || 'schema.table' fits in 63 bytes too;
--   * not in the schemas changefeed, information_schema or pg_*, and no table named
--     changefeed*.
-- The regular expression runs under the C collation, so [a-z] means those 26 code points
-- and nothing that sorts between them.
create function changefeed.check_outbox_name(p_name text)
returns text[]
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_parts text[];
begin
    if p_name is not null
        and char_length(p_name) <= 52
        and p_name collate "C" ~ '^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$'
    then
        v_parts := string_to_array(p_name, '.');
        if char_length(v_parts[2]) <= 40
            and v_parts[1] <> 'changefeed'
            and v_parts[1] <> 'information_schema'
            and v_parts[1] not like 'pg\_%'
            and v_parts[2] not like 'changefeed%'
        then
            return v_parts;
        end if;
    end if;
    raise exception using
        errcode = 'CF000',
        message = format(
            'changefeed.setup_outbox: %s is not a usable outbox name',
            coalesce(quote_literal(p_name), 'NULL')
        ),
        hint = 'Write it as schema.table (e.g. public.outbox): lower-case ASCII letters, '
            || 'digits and underscores, not starting with a digit; the table at most 40 '
            || 'characters and the whole name at most 52; not in the schemas changefeed, '
            || 'information_schema or pg_*, and no table named changefeed*.';
end
$$;
