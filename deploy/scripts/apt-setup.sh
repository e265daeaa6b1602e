#!/usr/bin/env bash
# Install the system packages txrepl needs, only where they are missing:
# Java 17 for Spark, PostgreSQL 15 server binaries (tests start private
# instances), wal2json, MariaDB server binaries (tests start private mariadbd
# instances; the system service is not used), and the JDBC drivers Spark loads
# through spark.jars.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
[[ -x /usr/lib/postgresql/15/bin/initdb ]] || need+=(postgresql-15 postgresql-client-15)
[[ -e /usr/lib/postgresql/15/lib/wal2json.so ]] || need+=(postgresql-15-wal2json)
[[ -e /usr/share/java/postgresql.jar ]] || need+=(libpostgresql-jdbc-java)
[[ -e /usr/share/java/sqlite-jdbc.jar ]] || need+=(libxerial-sqlite-jdbc-java)
command -v mariadb-install-db >/dev/null 2>&1 || need+=(mariadb-server mariadb-client)
[[ -e /usr/share/java/mariadb-java-client.jar ]] || need+=(libmariadb-java)
if ((${#need[@]} == 0)); then
  echo "system packages: all present"
  exit 0
fi
if [[ $(id -u) != 0 ]]; then SUDO=sudo; else SUDO=; fi
echo "installing system packages: ${need[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
