#!/usr/bin/env bash
# Builds baton's container images (baton-coordinator, baton-agent,
# baton-trainer) from deploy/images/Containerfile with podman or buildah; no
# container daemon is needed.
#
#   deploy/images/build.sh                        # pull debian:bookworm-slim
#   deploy/images/build.sh --base debootstrap     # no registry: make the base here
#   deploy/images/build.sh --base debootstrap --check   # ...and run each image once
#
# --base debootstrap makes a minimal Debian 12 root filesystem with
# debootstrap (from apt), trims it the way debian:bookworm-slim is trimmed,
# and imports it as localhost/debian:bookworm-slim, which the build then uses
# instead of pulling (--pull=never). The root filesystem, its tar and the
# build context (a snapshot of the sources) are kept under --cache (default
# /var/tmp/baton-images), outside the repository; an existing
# localhost/debian:bookworm-slim is reused unless --refresh-base.
#
# Options:
#   --base pull|debootstrap   where the base image comes from (default: pull)
#   --tool podman|buildah     builder (default: podman when installed)
#   --tag TAG                 image tag (default: dev, the tag deploy/k8s uses;
#                             give a release its own, e.g. the git commit)
#   --registry PREFIX         image name prefix (default: localhost)
#   --targets LIST            comma-separated subset of coordinator,agent,trainer
#   --jobs N                  compile jobs inside the build (default: nproc)
#   --mirror URL              Debian mirror for debootstrap (default: apt's)
#   --cache DIR               work directory (default: /var/tmp/baton-images)
#   --refresh-base            make the debootstrap base again
#   --check                   run each image once: --help of the binaries,
#                             `import baton.torch` and the example scripts
#                             in the trainer (podman + runc)
#   --runtime PATH            OCI runtime for --check (default: runc on PATH)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/deploy/images"

base=pull
tool=""
tag=dev
registry=localhost
targets=coordinator,agent,trainer
jobs=$(nproc)
mirror=""
cache=/var/tmp/baton-images
refresh_base=0
check=0
runtime=""

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=$2; shift 2 ;;
    --tool) tool=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --registry) registry=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --refresh-base) refresh_base=1; shift ;;
    --check) check=1; shift ;;
    --runtime) runtime=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "build.sh: unknown argument $1" >&2; usage ;;
  esac
done

say() { echo "build.sh: $*" >&2; }
die() { say "$*"; exit 1; }

case "$base" in pull|debootstrap) ;; *) die "--base must be pull or debootstrap, not \"$base\"" ;; esac
if [ -z "$tool" ]; then
  if command -v podman >/dev/null 2>&1; then tool=podman
  elif command -v buildah >/dev/null 2>&1; then tool=buildah
  else die "neither podman nor buildah is installed: apt-get install podman (or buildah)"
  fi
fi
case "$tool" in
  podman) build_cmd=(podman build) ;;
  buildah) build_cmd=(buildah bud) ;;
  *) die "--tool must be podman or buildah, not \"$tool\"" ;;
esac
command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed: apt-get install $tool"

# Seconds since $1 (a date +%s value), for the timing summary.
since() { echo $(( $(date +%s) - $1 )); }
timings=()

base_image=docker.io/library/debian:bookworm-slim
pull=(--pull=missing)
if [ "$base" = debootstrap ]; then
  base_image=localhost/debian:bookworm-slim
  pull=(--pull=never)
  if [ "$refresh_base" = 1 ] || ! "$tool" inspect --type image "$base_image" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null 2>&1 || die "debootstrap is not installed: apt-get install debootstrap"
    [ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
    if [ -z "$mirror" ]; then
      # The mirror apt uses here (deb822 or one-line sources), else Debian's.
      mirror=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
        | grep -v security | grep -m1 -oE 'https?://[^ ]+/debian/?' || true)
      mirror=${mirror:-http://deb.debian.org/debian}
    fi
    mirror=${mirror%/}
    security=${mirror%/debian}/debian-security
    started=$(date +%s)
    rootfs="$cache/rootfs"
    say "making the base image from $mirror with debootstrap (minbase) in $rootfs"
    rm -rf "$rootfs" && mkdir -p "$rootfs"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
      die "debootstrap failed; see $cache/debootstrap.log"
    # What debian:bookworm-slim does: no docs, man pages or locales from
    # later installs, apt lists and caches cleaned after each install.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/slim" <<'EOF'
APT::Install-Recommends "false";
Acquire::GzipIndexes "true";
Acquire::CompressionTypes::Order:: "gz";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
EOF
    cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
EOF
    find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
    rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
      "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
      "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
    tar -C "$rootfs" --numeric-owner -cf "$cache/rootfs.tar" .
    # The image's configuration as debian:bookworm-slim has it.
    slim_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    if [ "$tool" = podman ]; then
      podman import --change 'CMD ["bash"]' --change "ENV PATH=$slim_path" \
        --message "debootstrap --variant=minbase bookworm $mirror" "$cache/rootfs.tar" "$base_image" >/dev/null
    else
      ctr=$(buildah from scratch)
      buildah add "$ctr" "$cache/rootfs.tar" / >/dev/null
      buildah config --cmd bash --env "PATH=$slim_path" "$ctr"
      buildah commit --rm "$ctr" "$base_image" >/dev/null
    fi
    timings+=("base image (debootstrap + import): $(since "$started") s")
  else
    say "using the existing $base_image (--refresh-base makes it again)"
  fi
fi

# The build context: a snapshot of the sources the images are built from
# (tracked files and new ones git does not ignore), taken once, so that all
# images of one run come from the same sources and share the build stage's
# cached layers even while the tree changes.
context="$root"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  context="$cache/context"
  rm -rf "$context" && mkdir -p "$context"
  git -C "$root" ls-files -z --cached --others --exclude-standard -- \
      CMakeLists.txt protos common coordinator agent client tools docs/examples |
    while IFS= read -r -d '' f; do [ -e "$root/$f" ] && printf '%s\0' "$f"; done |
    tar -C "$root" --null -T - -cf - | tar -C "$context" -xf -
fi

IFS=, read -r -a target_list <<<"$targets"
images=()
for target in "${target_list[@]}"; do
  case "$target" in coordinator|agent|trainer) ;; *) die "unknown target \"$target\": coordinator, agent or trainer" ;; esac
  image="$registry/baton-$target:$tag"
  started=$(date +%s)
  say "building $image"
  # chroot isolation: RUN steps need no container runtime or daemon.
  "${build_cmd[@]}" --isolation chroot --layers "${pull[@]}" \
    -f "$here/Containerfile" --ignorefile "$here/Containerfile.dockerignore" \
    --build-arg BASE="$base_image" --build-arg JOBS="$jobs" \
    --target "$target" -t "$image" "$context"
  timings+=("$image: $(since "$started") s")
  images+=("$image")
done

if [ "$check" = 1 ]; then
  command -v podman >/dev/null 2>&1 || die "--check runs the images with podman: apt-get install podman runc"
  runtime=${runtime:-$(command -v runc || true)}
  [ -n "$runtime" ] || die "--check needs runc: apt-get install runc"
  # Limits the container can keep: podman's defaults (1M open files) need
  # CAP_SYS_RESOURCE, which some hosts (sandboxes, nested containers) lack,
  # and podman itself caps processes at 32768.
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] && nofile=1048576
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  run=(podman run --rm --runtime "$runtime" --network none --read-only
       --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
  # expect IMAGE PATTERN [podman run arguments...]: runs the image, prints
  # the first lines of its output and fails unless a line matches PATTERN.
  expect() {
    local image=$1 pattern=$2 out
    shift 2
    out=$("${run[@]}" "$@" 2>&1) || true  # gflags' --help exits 1 in batonrun
    printf '%s\n' "$out" | head -3 | sed "s|^|  $(basename "${image%%:*}") |" >&2
    grep -qE -- "$pattern" <<<"$out" || die "$image: expected /$pattern/ in the output above"
  }
  for image in "${images[@]}"; do
    say "checking $image (podman run --runtime $runtime)"
    case "$image" in
      */baton-coordinator:*)
        expect "$image" '^  --shutdown_grace_ms ' "$image" --help
        expect "$image" '^  --coordinator ' --entrypoint batonctl "$image" --help ;;
      */baton-agent:*)
        expect "$image" '^  --socket ' "$image" --help ;;
      */baton-trainer:*)
        expect "$image" '-procs_per_node ' "$image" --help
        expect "$image" '^import baton.torch: ok' --entrypoint python3 "$image" -c \
          'import baton, baton.torch, torch; print("import baton.torch: ok (torch", torch.__version__ + ")")'
        expect "$image" '^examples: ok' --entrypoint python3 "$image" -c \
          'import pathlib; [compile(pathlib.Path("/opt/baton/examples", f).read_text(), f, "exec") for f in ("train_synthetic.py", "train_elastic.py")]; print("examples: ok")'
        expect "$image" '^uid=10001\(baton\)' --entrypoint id "$image" ;;
    esac
  done
fi

say "done: ${images[*]}"
for t in "${timings[@]}"; do say "  $t"; done
"$tool" images --format '{{.Repository}}:{{.Tag}} {{.Size}}' 2>/dev/null |
  grep -E "/baton-(coordinator|agent|trainer):$tag |/debian:bookworm-slim " >&2 || true
