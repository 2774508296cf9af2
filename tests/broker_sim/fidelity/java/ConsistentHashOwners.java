import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.SortedMap;
import java.util.TreeMap;

/**
 * Reference for broker_sim's consistent-hash allocation, written for its tests: a ring hashed as RocketMQ
 * 4.9.8's ConsistentHashRouter hashes (MD5, first four bytes big-endian), held in a java.util.TreeMap, with
 * ten virtual nodes "clientId-i" per client in sorted client order; a queue's key is Java's
 * MessageQueue.toString(). Input lines: "topic;broker1,broker2;queuesPerBroker;cid1,cid2,...".
 * Output lines: the owning client id of each queue, in (broker, queueId) order, separated by spaces.
 * Run: java ConsistentHashOwners.java < input
 */
public class ConsistentHashOwners {
    static long hash(String key) throws Exception {
        byte[] d = MessageDigest.getInstance("MD5").digest(key.getBytes("UTF-8"));
        long v = 0;
        for (int i = 0; i < 4; i++) {
            v = (v << 8) | (d[i] & 0xFF);
        }
        return v;
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split(";");
            List<String> cids = new ArrayList<>(Arrays.asList(f[3].split(",")));
            Collections.sort(cids);
            TreeMap<Long, String> ring = new TreeMap<>();
            for (String c : cids) {
                for (int i = 0; i < 10; i++) {
                    ring.put(hash(c + "-" + i), c);
                }
            }
            List<String> owners = new ArrayList<>();
            for (String broker : f[1].split(",")) {
                for (int q = 0; q < Integer.parseInt(f[2]); q++) {
                    String key = "MessageQueue [topic=" + f[0] + ", brokerName=" + broker + ", queueId=" + q + "]";
                    SortedMap<Long, String> tail = ring.tailMap(hash(key));
                    owners.add(ring.get(tail.isEmpty() ? ring.firstKey() : tail.firstKey()));
                }
            }
            System.out.println(String.join(" ", owners));
        }
    }
}
