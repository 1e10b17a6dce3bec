#!/usr/bin/env bash
# Debian packages the test suite needs beyond Python: iproute2 (ip, tc: the kernel backend),
# chromium + chromium-driver (the dashboard's real-browser test) and openssh-server (sshd in the
# stand-in hosts `wansync deploy` is tested against). Called by scripts/test.sh.
# Without root or apt it installs nothing and says so; the tests that need a package then skip
# with the reason.
set -uo pipefail
want=()
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || want+=(iproute2)
command -v chromium >/dev/null 2>&1 || want+=(chromium)
command -v chromedriver >/dev/null 2>&1 || want+=(chromium-driver)
[ -x /usr/sbin/sshd ] || want+=(openssh-server)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: not root or no apt-get; not installing ${want[*]} (tests needing them will skip)"
  exit 0
fi
echo "install-system-deps: installing ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends "${want[@]}" >/tmp/wansync-apt.log 2>&1; then
  apt-get update -qq >>/tmp/wansync-apt.log 2>&1
  apt-get install -y -qq --no-install-recommends "${want[@]}" >>/tmp/wansync-apt.log 2>&1 \
    || echo "install-system-deps: apt-get failed (see /tmp/wansync-apt.log); tests needing ${want[*]} will skip"
fi
exit 0
