import textwrap

import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc.config import TCP_DEFAULTS, ConfigError, load_config

GOOD = """
source:
  dsn: postgresql://cdc@127.0.0.1:5432/shop
  slot: shop_cdc
  publication: shop_cdc
tables:
  - public.customers
  - name: public.orders
    key: [id]
kafka:
  bootstrap_servers: 127.0.0.1:9092
topic_prefix: shop
format: json
"""


def write(tmp_path, text):
    p = tmp_path / "cdc.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_the_issue_example_loads(tmp_path):
    c = load_config(write(tmp_path, GOOD))
    assert [t.name for t in c.tables] == ["public.customers", "public.orders"]
    assert c.tables[0].key is None and c.tables[1].key == ["id"]
    assert c.source.database == "shop"
    assert c.kafka.partitions == 1


def test_environment_overrides_yaml_through_the_same_model(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", "broker:29092")
    monkeypatch.setenv("CDC_SOURCE__PASSWORD", "s3cret")
    c = load_config(write(tmp_path, GOOD))
    assert c.kafka.bootstrap_servers == "broker:29092"
    assert c.source.slot == "shop_cdc"  # the rest of the section is kept
    assert "password=s3cret" in c.source.conninfo()
    assert "s3cret" not in repr(c)


def test_password_file_is_read(tmp_path):
    (tmp_path / "pw").write_text("filepass\n")
    text = GOOD.replace("  publication: shop_cdc", f"  publication: shop_cdc\n  password_file: {tmp_path / 'pw'}")
    c = load_config(write(tmp_path, text))
    assert "password=filepass" in c.source.conninfo()


def test_connections_get_tcp_keepalives_and_a_user_timeout_unless_the_dsn_sets_them(tmp_path):
    c = load_config(write(tmp_path, GOOD))
    params = conninfo_to_dict(c.source.conninfo(application_name="x"))
    assert {k: params[k] for k in TCP_DEFAULTS} == TCP_DEFAULTS
    assert params["application_name"] == "x"
    own = load_config(write(tmp_path, GOOD.replace("/shop", "/shop?keepalives_idle=300&tcp_user_timeout=0")))
    params = conninfo_to_dict(own.source.conninfo())
    assert params["keepalives_idle"] == "300" and params["tcp_user_timeout"] == "0"  # the DSN wins
    assert params["keepalives_count"] == "3"  # the rest still default


def test_a_password_in_the_dsn_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="source.dsn: .*holds a password"):
        load_config(write(tmp_path, GOOD.replace("cdc@", "cdc:pw@")))


def test_unknown_keys_are_errors_naming_their_path(tmp_path):
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_server: unknown key"):
        load_config(
            write(
                tmp_path,
                GOOD.replace("bootstrap_servers: 127.0.0.1:9092", "bootstrap_servers: a:1\n  bootstrap_server: b"),
            )
        )


def test_missing_keys_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"source\.slot: required key is missing"):
        load_config(write(tmp_path, GOOD.replace("  slot: shop_cdc\n", "")))


def test_malformed_yaml_is_reported_as_such(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "source: [unclosed\n"))


def test_a_missing_file_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the configuration file"):
        load_config(tmp_path / "nope.yaml")


def test_a_non_compacted_cleanup_policy_is_refused(tmp_path):
    text = GOOD.replace(
        "  bootstrap_servers: 127.0.0.1:9092", "  bootstrap_servers: a:1\n  topic_config:\n    cleanup.policy: delete"
    )
    with pytest.raises(ConfigError, match="cleanup.policy must include compact"):
        load_config(write(tmp_path, text))


def test_delivery_critical_producer_settings_cannot_be_overridden(tmp_path):
    text = GOOD.replace("  bootstrap_servers: 127.0.0.1:9092", "  bootstrap_servers: a:1\n  producer:\n    acks: '1'")
    with pytest.raises(ConfigError, match="acks cannot be overridden"):
        load_config(write(tmp_path, text))


def test_duplicate_tables_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="listed more than once: public.customers"):
        load_config(write(tmp_path, GOOD.replace("  - public.customers", "  - public.customers\n  - customers")))


def test_unqualified_table_names_default_to_public(tmp_path):
    c = load_config(write(tmp_path, GOOD.replace("  - public.customers", "  - customers")))
    assert c.tables[0].name == "public.customers"


def test_tables_take_names_globs_and_regexes_in_one_list(tmp_path):
    text = (
        GOOD.replace(
            "  - name: public.orders\n    key: [id]\n",
            "  - name: public.orders\n    key: [id]\n  - pattern: order_*\n    exclude_columns: [note]\n"
            "  - regex: 'sales\\.orders_\\d{4}'\n    allow_empty: true\n",
        )
        + "table_rescan_interval_s: 60\n"
    )
    c = load_config(write(tmp_path, text))
    assert [t.selector for t in c.tables] == [
        "public.customers",
        "public.orders",
        "pattern 'public.order_*'",
        "regex 'sales\\\\.orders_\\\\d{4}'",
    ]
    assert c.tables[3].allow_empty and c.table_rescan_interval_s == 60


def test_a_bad_pattern_is_named_with_its_key_path(tmp_path):
    text = GOOD.replace("  - public.customers\n", "  - public.customers\n  - regex: 'public\\.(orders'\n")
    with pytest.raises(ConfigError, match=r"tables\.1\.regex: .*not a valid regular expression"):
        load_config(write(tmp_path, text))


def test_the_same_pattern_twice_is_refused(tmp_path):
    text = GOOD.replace("  - public.customers\n", "  - pattern: public.x*\n  - pattern: x*\n")
    with pytest.raises(ConfigError, match=r"listed more than once: pattern 'public.x\*'"):
        load_config(write(tmp_path, text))
