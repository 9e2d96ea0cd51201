// Read-only whole-file mappings (mapped_file.h).
#include "mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int mapped_file_open(MappedFile *f, const char *path, Error *err) {
    *f = (MappedFile){0};
    // O_NONBLOCK: a FIFO's open would otherwise wait for a writer before the check below refuses it.
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, "%s: not a regular file", path);
    }
    f->bytes = (size_t)st.st_size;
    if (f->bytes > 0) {  // mmap refuses a length of zero; an empty file maps to nothing
        void *map = mmap(NULL, f->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fail(err, "%s: cannot memory-map: %s", path, strerror(e));
        }
        f->data = map;
    }
    close(fd);
    return 0;
}

void mapped_file_close(MappedFile *f) {
    if (f->data) munmap(f->data, f->bytes);
    *f = (MappedFile){0};
}
