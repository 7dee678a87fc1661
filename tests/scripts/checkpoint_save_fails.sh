#!/bin/sh
# quiver-train whose checkpoint writes fail: a file-size limit far below a checkpoint's size, its
# signal (SIGXFSZ) ignored, so each write gets EFBIG as on a full disk. The save after epoch 1 is
# a warning and training goes on; the epochs' results are printed; the save after training fails
# too, and the exit status is 1. Arguments: quiver-train and its options, without --checkpoint.
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
(
  trap '' XFSZ
  ulimit -f 1 || exit 3
  exec "$@" --checkpoint "$dir/z.ckpt"
)
status=$?
echo "exit $status"
[ -e "$dir/z.ckpt" ] && echo "a checkpoint was left" || echo "no checkpoint left"
exit $status
