/* file.c: opening the files kiln reads, and checking the text in them. Only regular files are read: a FIFO, a directory, a device
   or a socket is refused with its kind named, and the open never blocks (a FIFO opened for reading
   without O_NONBLOCK waits for a writer, forever). */
#define _GNU_SOURCE
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *kiln_file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

int kiln_open_regular(const char *op, const char *path, int64_t *size) {
  if (!path) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: the path is missing (NULL)", op);
    return -1;
  }
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    struct stat lst, st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))   /* a socket cannot be opened at all */
      kiln_fail(KILN_ERR_IO, "%s: %s is %s, not a regular file", op, path, kiln_file_kind(st.st_mode));
    else if (e == ENOENT && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
      kiln_fail(KILN_ERR_IO, "%s: %s: cannot open: a symbolic link to a missing file", op, path);
    else
      kiln_fail(KILN_ERR_IO, "%s: %s: cannot open: %s", op, path, strerror(e));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    kiln_fail(KILN_ERR_IO, "%s: %s: cannot stat: %s", op, path, strerror(e));
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    kiln_fail(KILN_ERR_IO, "%s: %s is %s, not a regular file", op, path, kiln_file_kind(st.st_mode));
    return -1;
  }
  int flags = fcntl(fd, F_GETFL);   /* reads of a regular file block as usual */
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (size) *size = (int64_t)st.st_size;
  return fd;
}

KILN_API int kiln_file_check(const char *op, const char *path) {
  int fd = kiln_open_regular(op ? op : "open", path, NULL);
  if (fd < 0) return kiln_error_code();
  close(fd);
  return KILN_OK;
}

/* The offset of the first byte of s[0..n) that is not valid UTF-8 (overlong forms, surrogates and
   code points past U+10FFFF are invalid), or -1 when all of it is. */
int64_t kiln_utf8_invalid_at(const unsigned char *s, int64_t n) {
  int64_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) { i++; continue; }
    int len;
    unsigned min, cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; min = 0x80; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; min = 0x800; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; min = 0x10000; cp = c & 0x07; }
    else return i;
    if (i + len > n) return i;
    for (int k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = cp << 6 | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return -1;
}
