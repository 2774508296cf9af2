#!/usr/bin/env bash
# Starts the local services the tests use when they do not answer on their default ports.
# Tests also honour RELIABLE_TEST_* URLs; this script only looks after the defaults.
set -uo pipefail
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { for _ in $(seq 1 60); do up "$1" && return 0; sleep 0.5; done; echo "services: port $1 did not open" >&2; return 1; }
if ! up 5432 && command -v pg_ctlcluster >/dev/null; then
  echo "services: starting PostgreSQL"; pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start; wait_port 5432
fi
if ! up 3306 && [ -x /usr/sbin/mariadbd ]; then
  echo "services: starting MariaDB"; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd; wait_port 3306
fi
if ! up 6379 && command -v redis-server >/dev/null; then
  echo "services: starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /tmp --logfile /tmp/redis-ci.log
  wait_port 6379
fi
if ! up 5672 && command -v rabbitmq-server >/dev/null; then
  echo "services: starting RabbitMQ"; rabbitmq-server -detached; wait_port 5672
fi
exit 0
