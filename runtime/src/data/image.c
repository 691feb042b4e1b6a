/* image.c: image files to pixels and back, through stb_image and stb_image_write (Debian's
   libstb-dev headers, compiled here once, static, with only the formats kiln reads). A file is read
   whole, its declared size checked with stbi_info before anything is decoded, and stb_image reads
   it through callbacks that notice when the decoder asks for bytes past the end: stb_image itself
   hands out zeros there, which would turn a truncated file into a silently black bottom.
   Debian 12's stb_image is 2.27: the work-arounds for its bugs that fuzzing found are marked
   "2.27" below (docs/data.md lists them). */
#include "data.h"
#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_ONLY_TGA
#define STBI_ONLY_PNM
#define STBI_MAX_DIMENSIONS (1 << 24)
/* Never abort the process on a file (STYLE.md): stb_image's asserts guard its own invariants;
   malformed files are refused by the checks here or fail in stb_image with a reason. */
#define STBI_ASSERT(x) ((void)0)
/* stb's code is not ours to lint; under STB_*_STATIC it declares functions it never defines
   (reported at the end of the file, so that warning stays off for the whole file) */
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/* stb_image 2.27 copies 0 bytes from or to a NULL buffer on some malformed PNGs (harmless, but
   undefined behaviour that UBSan stops on): its copies go through this */
static void *stb_memcpy(void *dst, const void *src, size_t n) { return n ? memcpy(dst, src, n) : dst; }
#define memcpy stb_memcpy
#include <stb/stb_image.h>

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBIW_ASSERT(x) ((void)0)
#define STBI_WRITE_NO_STDIO
#include <stb/stb_image_write.h>
#undef memcpy
#pragma GCC diagnostic pop

/* ---- reading ---- */

/* The whole file in a malloc'd buffer. Opened non-blocking so that a FIFO cannot hang the reader;
   anything but a regular file is refused. */
static int read_file(const char *path, unsigned char **bytes, int64_t *n) {
  *bytes = NULL;
  *n = 0;
  int64_t file_size = 0;
  int fd = kiln_open_regular("image", path, &file_size);
  if (fd < 0) return kiln_error_code();
  if (file_size == 0) {
    close(fd);
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: empty file (0 bytes)", path);
  }
  if (file_size > KILN_IMAGE_MAX_FILE_BYTES) {
    close(fd);
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: the file has %lld bytes, more than the limit of %d "
                     "(KILN_IMAGE_MAX_FILE_BYTES)", path, (long long)file_size, KILN_IMAGE_MAX_FILE_BYTES);
  }
  int64_t size = file_size;
  unsigned char *buf = malloc((size_t)size);
  if (!buf) {
    close(fd);
    return kiln_fail(KILN_ERR_MEMORY, "image: %s: out of memory reading %lld bytes", path, (long long)size);
  }
  int64_t done = 0;
  while (done < size) {
    ssize_t got = read(fd, buf + done, (size_t)(size - done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int e = errno;
      free(buf);
      close(fd);
      return kiln_fail(KILN_ERR_IO, "image: %s: read error at offset %lld: %s", path, (long long)done, strerror(e));
    }
    if (got == 0) break;
    done += got;
  }
  close(fd);
  if (done < size) {
    free(buf);
    return kiln_fail(KILN_ERR_IO, "image: %s: the file shrank while it was read (%lld of %lld bytes)", path,
                     (long long)done, (long long)size);
  }
  *bytes = buf;
  *n = size;
  return KILN_OK;
}

/* What the first bytes say the file is (for messages; stb_image decides by itself). */
static const char *sniff(const unsigned char *b, int64_t n) {
  if (n >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8)) return "PNG";
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return "JPEG";
  if (n >= 2 && b[0] == 'B' && b[1] == 'M') return "BMP";
  if (n >= 6 && (!memcmp(b, "GIF87a", 6) || !memcmp(b, "GIF89a", 6))) return "GIF";
  if (n >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6')) return "PNM";
  if (n >= 2 && b[0] == 'P' && b[1] >= '1' && b[1] <= '7') return "PNM (only binary P5/P6 are read)";
  return NULL;
}

/* stb_image reads the buffer through these; a read at the end marks the file truncated. */
struct mem_reader {
  const unsigned char *p;
  int64_t n, pos;
  int overrun;
};

static int mem_read(void *user, char *data, int size) {
  struct mem_reader *r = user;
  if (size <= 0) return 0;
  int64_t left = r->n - r->pos;
  if (left <= 0) {
    r->overrun = 1;
    return 0;
  }
  if (size > left) size = (int)left;
  memcpy(data, r->p + r->pos, (size_t)size);
  r->pos += size;
  return size;
}

static void mem_skip(void *user, int n) {
  struct mem_reader *r = user;
  r->pos += n;
  if (r->pos < 0) r->pos = 0;
  if (r->pos > r->n) r->pos = r->n;
}

static int mem_eof(void *user) {
  struct mem_reader *r = user;
  return r->pos >= r->n;
}

static const stbi_io_callbacks mem_callbacks = {mem_read, mem_skip, mem_eof};

static const char *stb_reason(void) {
  const char *why = stbi_failure_reason();
  return why ? why : "unknown";
}

/* Debian 12's stb_image (2.27) writes past its Huffman arrays when a DHT segment declares more than
   256 codes (CVE-2021-37789; 2.28 checks it). Every DHT that stb_image could reach is checked here
   first, mirroring how it walks a JPEG: segments by their lengths, entropy-coded data up to the next
   marker (FF followed by anything but 00, a restart marker or another FF). Bytes past the end read
   as 0, as stb_image reads them. */
/* A PNG's chunks, each length, type, data and CRC, must fit in the file. stb_image 2.27 grows its
   buffer for an IDAT chunk to the length the chunk declares before it reads the data: a file of
   100 bytes whose chunk claims 2 GB would make it allocate 2 GB. Walked here first, up to IEND. */
static int png_chunks_fit(const char *path, const unsigned char *b, int64_t n) {
  int64_t at = 8;
  while (at + 8 <= n) {
    uint32_t len = (uint32_t)b[at] << 24 | (uint32_t)b[at + 1] << 16 | (uint32_t)b[at + 2] << 8 | b[at + 3];
    char type[5] = {(char)b[at + 4], (char)b[at + 5], (char)b[at + 6], (char)b[at + 7], 0};
    int letters = 1;   /* a chunk type is 4 ASCII letters: anything else is not a chunk at all */
    for (int k = 0; k < 4; k++) {
      int c = (unsigned char)type[k];
      if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) letters = 0;
      if (c < 32 || c > 126) type[k] = '?';
    }
    if (!letters)
      return kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt PNG: no chunk at offset %lld (its type would be \"%s\")", path,
                       (long long)at, type);
    if (at == 8 && (memcmp(type, "IHDR", 4) != 0 || len != 13))
      return kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt PNG: the first chunk is \"%s\" of %u bytes, not the header "
                       "(IHDR, 13 bytes)", path, type, len);
    if ((int64_t)len > n - at - 12)
      return kiln_fail(KILN_ERR_FORMAT, "image: %s: truncated PNG: the %s chunk at offset %lld declares %u bytes, the file "
                       "has %lld after its header", path, type, (long long)at, len, (long long)(n - at - 8 > 0 ? n - at - 8 : 0));
    if (!memcmp(b + at + 4, "IEND", 4)) return KILN_OK;
    at += 12 + (int64_t)len;
  }
  return KILN_OK;
}

static int jpeg_huffman_tables_ok(const char *path, const unsigned char *b, int64_t n) {
#define BYTE(k) ((k) < n ? b[(k)] : 0)
  int64_t i = 2;
  while (i + 1 < n) {
    if (b[i] != 0xFF) { i++; continue; }
    unsigned m = b[i + 1];
    if (m == 0xFF) { i++; continue; }
    if (m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) { i += 2; continue; }
    if (m == 0xD9) break;
    int64_t len = (int64_t)BYTE(i + 2) << 8 | BYTE(i + 3);
    if (m == 0xC4) {
      int64_t left = len - 2, p = i + 4;
      while (left > 0) {
        unsigned q = BYTE(p);
        if ((q >> 4) > 1 || (q & 15) > 3) break;          /* stb_image stops here: "bad DHT header" */
        int64_t codes = 0;
        for (int k = 1; k <= 16; k++) codes += BYTE(p + k);
        if (codes > 256)
          return kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt JPEG: the Huffman table at offset %lld declares %lld "
                           "codes (at most 256)", path, (long long)p, (long long)codes);
        p += 17 + codes;
        left -= 17 + codes;
      }
    }
    i += 2 + (len >= 2 ? len : 2);
  }
#undef BYTE
  return KILN_OK;
}

/* Binary PGM and PPM (P5, P6), read here rather than by stb_image, whose 2.27 reads 16-bit samples as
   their low byte, ignores a maxval other than 255, accepts a maxval of 0, and overflows a signed int
   on a size of many digits. The header: magic, width, height and maxval, separated by whitespace
   and comments ("#" to the end of a line), then one whitespace byte and the samples: one byte each
   when maxval < 256, else two, big-endian. Samples are scaled to 8 bits, v * 255 / maxval rounded
   to nearest. */
static int pnm_field(const char *path, const unsigned char *b, int64_t n, int64_t *pos, const char *name, int64_t *value) {
  int64_t i = *pos;
  int space = 0;
  for (;;) {
    if (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r' || b[i] == '\v' || b[i] == '\f')) { i++; space = 1; }
    else if (i < n && b[i] == '#') { while (i < n && b[i] != '\n' && b[i] != '\r') i++; space = 1; }
    else break;
  }
  if (i >= n)
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: truncated PNM: the header ends before the %s", path, name);
  if (!space || b[i] < '0' || b[i] > '9')
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt PNM header: expected the %s at offset %lld", path, name, (long long)i);
  int64_t v = 0;
  for (; i < n && b[i] >= '0' && b[i] <= '9'; i++) {
    v = v * 10 + (b[i] - '0');
    if (v > INT32_MAX)
      return kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt PNM header: the %s at offset %lld is larger than %d", path,
                       name, (long long)*pos, INT32_MAX);
  }
  *pos = i;
  *value = v;
  return KILN_OK;
}

static int pnm_decode(const char *path, const unsigned char *b, int64_t n, int channels, int depth, struct kiln_u8_image *out) {
  int comp = b[1] == '5' ? 1 : 3;
  int64_t pos = 2, w, h, maxval;
  int rc;
  if ((rc = pnm_field(path, b, n, &pos, "width", &w)) || (rc = pnm_field(path, b, n, &pos, "height", &h)) ||
      (rc = pnm_field(path, b, n, &pos, "maxval", &maxval)))
    return rc;
  if (w == 0 || h == 0)
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: the PNM header declares a zero size (%lld x %lld pixels)", path,
                     (long long)w, (long long)h);
  if (maxval < 1 || maxval > 65535)
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt PNM header: maxval %lld (expected 1 to 65535)", path,
                     (long long)maxval);
  if (pos >= n || !(b[pos] == ' ' || b[pos] == '\t' || b[pos] == '\n' || b[pos] == '\r' || b[pos] == '\v' || b[pos] == '\f'))
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt PNM header: no whitespace after the maxval at offset %lld",
                     path, (long long)pos);
  pos++;
  int c = channels ? channels : comp;
  int bytes_per = maxval > 255 ? 2 : 1;
  if (w * h * (int64_t)(comp + c) > KILN_IMAGE_MAX_BYTES)
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: the PNM header declares %lld x %lld pixels (%d channels in the file, "
                     "%d wanted): decoding them takes about %lld bytes, more than the limit of %d "
                     "(KILN_IMAGE_MAX_BYTES); not decoded", path, (long long)w, (long long)h, comp, c,
                     (long long)(w * h * (comp + c)), KILN_IMAGE_MAX_BYTES);
  int64_t samples = w * h * comp;
  if (n - pos < samples * bytes_per)
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: truncated PNM: %lld x %lld pixels of %d bytes need %lld bytes after the "
                     "header, the file has %lld", path, (long long)w, (long long)h, comp * bytes_per,
                     (long long)(samples * bytes_per), (long long)(n - pos));
  int64_t top = depth == 16 ? 65535 : 255;
  unsigned char *pixels = STBI_MALLOC((size_t)(samples * (depth / 8)));
  if (!pixels) return kiln_fail(KILN_ERR_MEMORY, "image: %s: out of memory for %lld bytes", path, (long long)samples);
  const unsigned char *d = b + pos;
  for (int64_t k = 0; k < samples; k++) {
    int64_t v = bytes_per == 1 ? d[k] : (int64_t)d[2 * k] << 8 | d[2 * k + 1];
    if (v > maxval) v = maxval;   /* a sample above maxval is out of range: clip it to white */
    int64_t scaled = maxval == top ? v : (v * top + maxval / 2) / maxval;
    if (depth == 16) ((uint16_t *)pixels)[k] = (uint16_t)scaled;
    else pixels[k] = (unsigned char)scaled;
  }
  if (comp != c) {
    pixels = depth == 16 ? (unsigned char *)stbi__convert_format16((stbi__uint16 *)pixels, comp, c, (unsigned)w, (unsigned)h)
                         : stbi__convert_format(pixels, comp, c, (unsigned)w, (unsigned)h);
    if (!pixels) return kiln_fail(KILN_ERR_MEMORY, "image: %s: out of memory converting %d to %d channels", path, comp, c);
  }
  *out = (struct kiln_u8_image){pixels, (int)w, (int)h, c, depth};
  return KILN_OK;
}

int kiln_image_decode(const char *path, int channels, struct kiln_u8_image *out) {
  return kiln_image_decode_depth(path, channels, 8, out);
}

int kiln_image_decode_depth(const char *path, int channels, int depth, struct kiln_u8_image *out) {
  memset(out, 0, sizeof *out);
  if (!path) return kiln_fail(KILN_ERR_ARGUMENT, "image: the path is missing (NULL)");
  if (depth != 8 && depth != 16)
    return kiln_fail(KILN_ERR_ARGUMENT, "image: %s: a depth of %d bits requested (expected 8 or 16)", path, depth);
  if (channels < 0 || channels > 4)
    return kiln_fail(KILN_ERR_ARGUMENT, "image: %s: %d channels requested (expected 1 grey, 2 grey+alpha, 3 RGB, "
                     "4 RGBA, or 0 for the file's own)", path, channels);
  unsigned char *bytes;
  int64_t n;
  int rc = read_file(path, &bytes, &n);
  if (rc) return rc;
  const char *kind = sniff(bytes, n);
  if (n >= 2 && bytes[0] == 'P' && (bytes[1] == '5' || bytes[1] == '6')) {
    rc = pnm_decode(path, bytes, n, channels, depth, out);
    free(bytes);
    return rc;
  }
  if (kind && !strcmp(kind, "PNG") && (rc = png_chunks_fit(path, bytes, n))) {
    free(bytes);
    return rc;
  }
  if (n >= 2 && bytes[0] == 0xFF && bytes[1] == 0xD8 && (rc = jpeg_huffman_tables_ok(path, bytes, n))) {
    free(bytes);
    return rc;
  }
  struct mem_reader r = {bytes, n, 0, 0};
  int w = 0, h = 0, comp = 0;
  int known = stbi_info_from_callbacks(&mem_callbacks, &r, &w, &h, &comp);
  /* stb_image refuses a PNG over 2^30 bytes or of 0 pixels itself, and then reports the last
     format it tried: read the IHDR here, so that the checks below name the real problem */
  if (!known && !r.overrun && kind && !strcmp(kind, "PNG") && n >= 33 && !memcmp(bytes + 12, "IHDR", 4)) {
    static const int png_channels[7] = {1, 0, 3, 3, 2, 0, 4};
    uint32_t pw = (uint32_t)bytes[16] << 24 | bytes[17] << 16 | bytes[18] << 8 | bytes[19];
    uint32_t ph = (uint32_t)bytes[20] << 24 | bytes[21] << 16 | bytes[22] << 8 | bytes[23];
    int pc = bytes[25] <= 6 ? png_channels[bytes[25]] : 0;
    if (pc && pw <= INT32_MAX && ph <= INT32_MAX &&
        (pw == 0 || ph == 0 || (int64_t)pw * ph * (pc + (channels ? channels : pc)) > KILN_IMAGE_MAX_BYTES)) {
      known = 1;
      w = (int)pw;
      h = (int)ph;
      comp = pc;
    }
  }
  if (!known) {
    if (r.overrun && kind)
      rc = kiln_fail(KILN_ERR_FORMAT, "image: %s: truncated %s: the header needs more than the file's %lld bytes",
                     path, kind, (long long)n);
    else if (kind)
      rc = kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt %s header (stb_image: %s)", path, kind, stb_reason());
    else
      rc = kiln_fail(KILN_ERR_FORMAT, "image: %s: not an image kiln reads (PNG, JPEG, BMP, GIF, TGA, PNM): the "
                     "file (%lld bytes) starts with %02X %02X %02X %02X", path, (long long)n, bytes[0],
                     n > 1 ? bytes[1] : 0, n > 2 ? bytes[2] : 0, n > 3 ? bytes[3] : 0);
    free(bytes);
    return rc;
  }
  if (!kind) kind = "TGA";
  /* a BMP stored top-down has a negative height in its header; stb_image decodes it upright */
  if (!strcmp(kind, "BMP") && h < 0 && h > INT32_MIN) h = -h;
  if (w <= 0 || h <= 0) {
    free(bytes);
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: the %s header declares a zero size (%d x %d pixels)", path, kind, w, h);
  }
  int c = channels ? channels : comp;
  /* The limit covers about what stb_image allocates on the way, not only the result: the pixels in
     the file's own channels (2 bytes each at 16 bits) and converted; for a GIF its frame and
     background (4 bytes a pixel each) and history (1). */
  int64_t per_pixel = comp + c * (depth / 8);
  if (!strcmp(kind, "GIF")) per_pixel = 9 + (depth == 16 ? 2 * c : 0);
  else {
    r = (struct mem_reader){bytes, n, 0, 0};
    if (stbi_is_16_bit_from_callbacks(&mem_callbacks, &r)) per_pixel = 2 * comp + c * (depth / 8);
  }
  int64_t need = (int64_t)w * h * per_pixel;
  if (need > KILN_IMAGE_MAX_BYTES) {
    free(bytes);
    return kiln_fail(KILN_ERR_FORMAT, "image: %s: the %s header declares %d x %d pixels (%d channels in the file, %d "
                     "wanted): decoding them takes about %lld bytes, more than the limit of %d (KILN_IMAGE_MAX_BYTES); "
                     "not decoded", path, kind, w, h, comp, c, (long long)need, KILN_IMAGE_MAX_BYTES);
  }
  r = (struct mem_reader){bytes, n, 0, 0};
  int w2 = 0, h2 = 0, comp2 = 0;
  /* at 16 bits stb_image keeps a 16-bit file's samples and widens an 8-bit one (v * 257) */
  unsigned char *pixels = depth == 16 ? (unsigned char *)stbi_load_16_from_callbacks(&mem_callbacks, &r, &w2, &h2, &comp2, c)
                                      : stbi_load_from_callbacks(&mem_callbacks, &r, &w2, &h2, &comp2, c);
  if (!pixels || r.overrun || w2 != w || h2 != h) {
    if (r.overrun)
      rc = kiln_fail(KILN_ERR_FORMAT, "image: %s: truncated %s: decoding %d x %d pixels needs more than the file's "
                     "%lld bytes", path, kind, w, h, (long long)n);
    else if (!pixels)
      rc = kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt %s (stb_image: %s)", path, kind, stb_reason());
    else
      rc = kiln_fail(KILN_ERR_FORMAT, "image: %s: corrupt %s: the header says %d x %d pixels, the data %d x %d", path,
                     kind, w, h, w2, h2);
    stbi_image_free(pixels);
    free(bytes);
    return rc;
  }
  free(bytes);
  *out = (struct kiln_u8_image){pixels, w, h, c, depth};
  return KILN_OK;
}

void kiln_image_free(struct kiln_u8_image *img) {
  if (img->pixels) stbi_image_free(img->pixels);
  img->pixels = NULL;
}

KILN_API struct kiln_tensor *kiln_image_read(const char *path, int channels) { return kiln_image_read_depth(path, channels, 8); }

/* [C,H,W]: u8 at 8 bits; i32 at 16 (kiln has no u16 dtype), each sample 0 to 65535. */
KILN_API struct kiln_tensor *kiln_image_read_depth(const char *path, int channels, int depth) {
  struct kiln_u8_image img;
  if (kiln_image_decode_depth(path, channels, depth, &img)) return NULL;
  int64_t sizes[3] = {img.c, img.h, img.w};
  struct kiln_tensor *t = kiln_tensor_empty(3, sizes, depth == 16 ? KILN_I32 : KILN_U8, (struct kiln_device){KILN_CPU, 0});
  if (t) {
    int64_t plane = (int64_t)img.h * img.w;
    if (depth == 16) {
      int32_t *dst = kiln_tensor_data(t);
      const uint16_t *src = (const uint16_t *)img.pixels;
      for (int64_t i = 0; i < plane; i++)
        for (int ch = 0; ch < img.c; ch++) dst[ch * plane + i] = src[i * img.c + ch];
    } else {
      unsigned char *dst = kiln_tensor_data(t);
      for (int64_t i = 0; i < plane; i++)
        for (int ch = 0; ch < img.c; ch++) dst[ch * plane + i] = img.pixels[i * img.c + ch];
    }
  }
  kiln_image_free(&img);
  return t;
}

/* ---- writing ---- */

struct mem_writer {
  unsigned char *data;
  size_t n, cap;
  int failed;
};

static void mem_write(void *context, void *data, int size) {
  struct mem_writer *m = context;
  if (m->failed || size <= 0) return;
  if (m->n + (size_t)size > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 4096;
    while (cap < m->n + (size_t)size) cap *= 2;
    unsigned char *p = realloc(m->data, cap);
    if (!p) { m->failed = 1; return; }
    m->data = p;
    m->cap = cap;
  }
  memcpy(m->data + m->n, data, (size_t)size);
  m->n += (size_t)size;
}

/* image [C,H,W] or [H,W] u8 as interleaved rows; out is malloc'd. */
static int interleave(const char *op, const char *path, const struct kiln_tensor *image, unsigned char **out, int *w,
                      int *h, int *c) {
  if (!path) return kiln_fail(KILN_ERR_ARGUMENT, "%s: the path is missing (NULL)", op);
  if (kiln_check_live(op, image)) return kiln_error_code();
  if (image->dtype != KILN_U8)
    return kiln_fail(KILN_ERR_DTYPE, "%s: %s: the image is %s %s (expected u8 [C,H,W] or [H,W])", op, path,
                     kiln_dtype_name(image->dtype), kiln_shape_string(image));
  if (image->device.type != KILN_CPU)
    return kiln_fail(KILN_ERR_DEVICE, "%s: %s: the image is on %s (expected the cpu)", op, path,
                     kiln_device_name(image->device));
  int three = image->ndim == 3;
  if ((image->ndim != 2 && !three) || (three && (image->sizes[0] < 1 || image->sizes[0] > 4)) ||
      image->sizes[image->ndim - 1] < 1 || image->sizes[image->ndim - 2] < 1 ||
      image->sizes[image->ndim - 1] > 65535 || image->sizes[image->ndim - 2] > 65535)
    return kiln_fail(KILN_ERR_SHAPE, "%s: %s: the image is %s (expected [C,H,W] with C 1 to 4, or [H,W], sides 1 "
                     "to 65535)", op, path, kiln_shape_string(image));
  *c = three ? (int)image->sizes[0] : 1;
  *h = (int)image->sizes[image->ndim - 2];
  *w = (int)image->sizes[image->ndim - 1];
  struct kiln_tensor *src = kiln_contiguous(image);
  if (!src) return kiln_error_code();
  unsigned char *buf = malloc((size_t)*w * *h * *c);
  if (!buf) {
    kiln_tensor_release(src);
    return kiln_fail(KILN_ERR_MEMORY, "%s: %s: out of memory", op, path);
  }
  const unsigned char *s = kiln_tensor_data(src);
  int64_t plane = (int64_t)*w * *h;
  for (int64_t i = 0; i < plane; i++)
    for (int ch = 0; ch < *c; ch++) buf[i * *c + ch] = s[ch * plane + i];
  kiln_tensor_release(src);
  *out = buf;
  return KILN_OK;
}

static int write_all(const char *op, const char *path, const struct mem_writer *m) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return kiln_fail(KILN_ERR_IO, "%s: cannot create %s: %s", op, path, strerror(errno));
  size_t done = 0;
  while (done < m->n) {
    ssize_t put = write(fd, m->data + done, m->n - done);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      int e = errno;
      close(fd);
      return kiln_fail(KILN_ERR_IO, "%s: cannot write %s: %s", op, path, strerror(e));
    }
    done += (size_t)put;
  }
  if (close(fd) != 0) return kiln_fail(KILN_ERR_IO, "%s: cannot write %s: %s", op, path, strerror(errno));
  return KILN_OK;
}

KILN_API int kiln_image_write_png(const char *path, const struct kiln_tensor *image) {
  const char *op = "image_write_png";
  unsigned char *pixels = NULL;
  int w = 0, h = 0, c = 0;
  int rc = interleave(op, path, image, &pixels, &w, &h, &c);
  if (rc) return rc;
  struct mem_writer m = {0};
  int ok = stbi_write_png_to_func(mem_write, &m, w, h, c, pixels, w * c);
  free(pixels);
  if (!ok || m.failed) rc = kiln_fail(KILN_ERR_MEMORY, "%s: %s: encoding failed (out of memory)", op, path);
  else rc = write_all(op, path, &m);
  free(m.data);
  return rc;
}
