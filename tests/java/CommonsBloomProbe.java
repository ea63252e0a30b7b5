// Glue for tests/test_bloom_java.py: runs commons-collections' Bloom filters and commons-codec's
// MurmurHash3 over many producer ids in one py4j call. Ids travel as 8-byte big-endian keys, results as
// big-endian bytes, because py4j copies byte arrays whole and every other array one element per call.
import java.nio.ByteBuffer;

import org.apache.commons.codec.digest.MurmurHash3;
import org.apache.commons.collections4.bloomfilter.BitMapExtractor;
import org.apache.commons.collections4.bloomfilter.EnhancedDoubleHasher;
import org.apache.commons.collections4.bloomfilter.Hasher;
import org.apache.commons.collections4.bloomfilter.Shape;
import org.apache.commons.collections4.bloomfilter.SimpleBloomFilter;

public class CommonsBloomProbe {
    private static long[] hash(byte[] keys, int i) {
        byte[] key = new byte[Long.BYTES];
        System.arraycopy(keys, i * Long.BYTES, key, 0, Long.BYTES);
        return MurmurHash3.hash128x64(key);
    }

    private static Hasher hasher(byte[] keys, int i) {
        long[] hash = hash(keys, i);
        return new EnhancedDoubleHasher(hash[0], hash[1]);
    }

    private static int count(byte[] keys) {
        return keys.length / Long.BYTES;
    }

    /** MurmurHash3.hash128x64 of each key: its two longs. */
    public byte[] hashes(byte[] keys) {
        ByteBuffer out = ByteBuffer.allocate(2 * keys.length);
        for (int i = 0; i < count(keys); i++) {
            for (long half : hash(keys, i)) {
                out.putLong(half);
            }
        }
        return out.array();
    }

    /** The k ints of indices(shape).asIndexArray() of each key, in order. */
    public byte[] indices(int k, int m, byte[] keys) {
        Shape shape = Shape.fromKM(k, m);
        ByteBuffer out = ByteBuffer.allocate(count(keys) * k * Integer.BYTES);
        for (int i = 0; i < count(keys); i++) {
            for (int index : hasher(keys, i).indices(shape).asIndexArray()) {
                out.putInt(index);
            }
        }
        return out.array();
    }

    /** The asBitMapArray() longs of a SimpleBloomFilter that merged every key. */
    public byte[] bitmap(int k, int m, byte[] keys) {
        SimpleBloomFilter filter = new SimpleBloomFilter(Shape.fromKM(k, m));
        for (int i = 0; i < count(keys); i++) {
            filter.merge(hasher(keys, i));
        }
        long[] words = filter.asBitMapArray();
        ByteBuffer out = ByteBuffer.allocate(words.length * Long.BYTES);
        out.asLongBuffer().put(words);
        return out.array();
    }

    /** One byte per key: 1 if a SimpleBloomFilter holding the given bitmap longs contains it. */
    public byte[] contains(int k, int m, byte[] bitmap, byte[] keys) {
        long[] words = new long[bitmap.length / Long.BYTES];
        ByteBuffer.wrap(bitmap).asLongBuffer().get(words);
        SimpleBloomFilter filter = new SimpleBloomFilter(Shape.fromKM(k, m));
        filter.merge(BitMapExtractor.fromBitMapArray(words));
        byte[] out = new byte[count(keys)];
        for (int i = 0; i < count(keys); i++) {
            out[i] = (byte) (filter.contains(hasher(keys, i)) ? 1 : 0);
        }
        return out;
    }
}
